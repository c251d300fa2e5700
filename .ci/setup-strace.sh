#!/usr/bin/env bash
# Installs strace for tests/privacy/test_no_raw_data.py, which traces the driver's openat calls to
# prove it never opens a data file (pyarrow opens files from C++, out of Python's sight).
# Failing here fails CI (.ci/run): the strace check must not skip.
set -euo pipefail
if command -v strace >/dev/null 2>&1; then
  echo "strace present"
  exit 0
fi
bash "$(dirname "$0")/apt-install.sh" --no-install-recommends strace
