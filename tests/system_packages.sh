#!/usr/bin/env bash
# The Debian packages some tests need, installed in one go: Slurm and munge with accounting's
# mariadb and slurmdbd (tests/slurm/cluster.sh install), TeX and pdftoppm (tests/tex/install.sh) and
# Chromium (tests/chromium/install.sh, for the MLflow UI tests). scripts/test.sh runs it beside the Python environment's install,
# so that on a fresh machine the downloads overlap pip's and no test session waits for them. Each
# step is skipped when its packages are there; without root or apt-get nothing is installed and
# the tests that need a package skip with the reason, as they would without this script.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "system_packages: not root with apt-get: nothing installed"
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
status=0
WITH_DBD=1 bash tests/slurm/cluster.sh install || status=$?
sh tests/tex/install.sh || status=$?
sh tests/chromium/install.sh || status=$?
exit "$status"
