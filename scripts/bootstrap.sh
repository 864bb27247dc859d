#!/usr/bin/env bash
# Creates .venv with the project's pinned environment (envs/requirements.txt) and the scalestudy
# package, once; later calls only re-install when the requirements changed. Sourced by
# scripts/demo.sh and scripts/test.sh, so a fresh machine needs nothing else.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
python="${PYTHON:-python3.11}"
command -v "$python" >/dev/null 2>&1 || python=python3
stamp="$venv/.requirements.sha256"
want="$(cat "$root/envs/requirements.txt" "$root/envs/requirements-dev.txt" "$root/pyproject.toml" | sha256sum | cut -d' ' -f1)"

if [[ ! -x "$venv/bin/python" ]]; then
  echo "bootstrap: creating $venv with $("$python" --version)" >&2
  "$python" -m venv "$venv"
fi
if [[ -L "$venv" && "$(cat "$stamp" 2>/dev/null)" != "$want" ]]; then
  # A linked environment is shared (the demo test links the checkout's): never install into it
  # from here, or its editable scalestudy would point at this copy.
  echo "bootstrap: $venv is a link to a shared environment that does not match envs/; run" \
    "scripts/bootstrap.sh in the checkout it belongs to" >&2
  exit 1
fi
if [[ "$(cat "$stamp" 2>/dev/null)" != "$want" ]]; then
  echo "bootstrap: installing envs/requirements.txt (torch is large: a few minutes the first time)" >&2
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip 2>/dev/null || true
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    -r "$root/envs/requirements.txt" -r "$root/envs/requirements-dev.txt" 2>&1 | grep -v "^WARNING: Location" >&2 || true
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps -e "$root" 2>&1 \
    | grep -v "^WARNING: Location" >&2 || true
  "$venv/bin/python" -c "import torch, torchvision, snakemake, pandas, matplotlib, scalestudy" \
    || { echo "bootstrap: the environment in $venv is incomplete (see pip's messages above)" >&2; exit 1; }
  echo "$want" > "$stamp"
fi
export PATH="$venv/bin:$PATH"
export VIRTUAL_ENV="$venv"
