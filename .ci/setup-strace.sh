#!/usr/bin/env bash
# Installs strace for tests/test_no_raw_data.py, which traces the driver's openat calls to
# prove it never opens a data file (pyarrow opens files from C++, out of Python's sight).
# Failing here fails CI (.ci/run): the strace check must not skip.
set -euo pipefail
if command -v strace >/dev/null 2>&1; then
  echo "strace present"
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || { echo "not root and no sudo: cannot install strace"; exit 1; }
  SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends strace
