#!/usr/bin/env bash
# Mutation testing of the privacy accounting (docs/testing.md): mutmut mutates the files in
# pyproject.toml [tool.mutmut] only_mutate and runs the fast tests that cover them against
# each mutant. Runs in a scratch copy of the tracked files, so the work tree is untouched.
# Usage: tests/mutation.sh [scratch-dir]   (PYTHON=... to pick the interpreter; default
# .venv/bin/python, which needs the 'mutation' extra: pip install -e '.[dev,mutation]').
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-$repo/.venv/bin/python}"
python="$(cd "$(dirname "$python")" && pwd)/$(basename "$python")"  # absolute, venv link kept
scratch="${1:-$(mktemp -d)}"
mkdir -p "$scratch"
cd "$repo"
git ls-files -z | xargs -0 cp --parents -t "$scratch"
cd "$scratch"
rm -rf mutants
start=$(date +%s)
"$python" -m mutmut run --max-children "${MUTMUT_CHILDREN:-2}" || true
echo "mutmut run: $(( $(date +%s) - start )) s in $scratch"
"$python" -m mutmut results
