#!/usr/bin/env bash
# Installs Debian's chromium for tests/test_report.py, which opens the report pages in
# headless Chromium (rendered DOM, screenshots, no network). Quick when already installed.
# Failing here fails CI (.ci/run): the browser checks must not skip.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
  echo "chromium present: $(chromium --version 2>/dev/null || true)"
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || { echo "not root and no sudo: cannot install chromium"; exit 1; }
  SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q chromium
