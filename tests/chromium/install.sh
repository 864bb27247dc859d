#!/bin/sh
# Installs Debian's chromium (the headless browser of the MLflow UI tests). Idempotent: exits at once
# when it is there. Needs root and apt-get (tests/mlflow_server.py and tests/system_packages.sh run
# it then); waits for dpkg's lock when another install runs, and refreshes empty package lists.
set -eu
if command -v chromium >/dev/null; then
    echo "chromium already installed"
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "needs root and apt-get to install chromium" >&2
    exit 2
fi
export DEBIAN_FRONTEND=noninteractive
install() { apt-get -o DPkg::Lock::Timeout=600 install -y -q chromium; }
install || { apt-get -o DPkg::Lock::Timeout=600 update -q && install; }
