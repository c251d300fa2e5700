#!/usr/bin/env bash
# The system services the test suite needs, each installed from Debian's packages when
# missing (.ci/setup-*.sh: PostgreSQL's server binaries for the ledger tests, strace for the
# no-raw-data test, Chromium for the report pages). Needs root or sudo; quick when all are
# present. A set-up that fails fails here: its tests would otherwise skip, and
# tests/conftest.py fails any skip that is not in its ALLOWED_SKIPS list.
set -euo pipefail
cd "$(dirname "$0")/.."
for setup in .ci/setup-*.sh; do
  [ -e "$setup" ] || continue
  echo "== $setup"
  bash "$setup" || { echo "error: $setup failed; its tests cannot run" >&2; exit 1; }
done
