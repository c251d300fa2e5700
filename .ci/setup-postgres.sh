#!/usr/bin/env bash
# Installs PostgreSQL's server binaries (initdb, pg_ctl) for the ledger tests when they are
# missing. The tests start and stop their own throwaway cluster on 127.0.0.1 (tests/pg.py);
# nothing is started here. Failing here fails CI (.ci/run): those tests must not skip.
set -euo pipefail
have_pg() {
  command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1 && return 0
  compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null
}
if have_pg; then
  echo "postgresql server binaries present"
  exit 0
fi
bash "$(dirname "$0")/apt-install.sh" postgresql
have_pg && echo "postgresql installed"
