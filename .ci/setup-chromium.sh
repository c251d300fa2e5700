#!/usr/bin/env bash
# Installs Debian's chromium for tests/report/test_report.py, which opens the report pages in
# headless Chromium (rendered DOM, screenshots, no network). Quick when already installed.
# Failing here fails CI (.ci/run): the browser checks must not skip.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
  echo "chromium present: $(chromium --version 2>/dev/null || true)"
  exit 0
fi
bash "$(dirname "$0")/apt-install.sh" chromium
