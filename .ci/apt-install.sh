#!/usr/bin/env bash
# Installs Debian packages for a .ci/setup-*.sh script, as root or through sudo:
#   bash .ci/apt-install.sh [apt-get install options] PACKAGE...
set -euo pipefail
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || { echo "not root and no sudo: cannot install $*"; exit 1; }
  SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q "$@"
