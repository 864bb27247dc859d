#!/usr/bin/env bash
# Creates .venv with the project's pinned environment (envs/requirements.txt) and the scalestudy
# package, once; later calls only re-install when the requirements changed. Sourced by
# scripts/demo.sh and scripts/test.sh, so a fresh machine needs nothing else.
#
#   bash scripts/bootstrap.sh        install (or check) .venv
#   source scripts/bootstrap.sh      the same, then .venv/bin first on PATH in this shell
#
# Sourced from an interactive shell, it leaves that shell's options as they were: the strict mode
# (set -euo pipefail) is confined to the installing subshell, and a failure returns, never exits.

_scalestudy_bootstrap() (
  set -euo pipefail

  # uv installs the lock's packages in a third of pip's time (23 s against 75 s on a 2-core machine: it
  # unpacks in parallel) and byte-compiles them on every core. It is fetched with pip and told pip's
  # index settings (scripts/uv_index_args.py), so it sees the mirror pip sees.
  install_with_uv() {
    local root=$1 venv=$2 settings arg uv_args=() uv_env=()
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check uv==0.13.9 2>&1 \
      | grep -v "^WARNING: Location" >&2 || true
    [[ -x "$venv/bin/uv" ]] || return 1
    settings="$("$venv/bin/python" "$root/scripts/uv_index_args.py" "$venv/bin/python")" || return 1
    while IFS= read -r arg; do
      case "$arg" in
        SSL_CERT_FILE=*) uv_env=("$arg") ;;
        ?*) uv_args+=("$arg") ;;
      esac
    done <<<"$settings"
    env "${uv_env[@]}" "$venv/bin/uv" pip install --quiet --python "$venv/bin/python" \
      --index-strategy unsafe-best-match --compile-bytecode "${uv_args[@]}" -r "$root/envs/requirements.lock" \
      || { echo "bootstrap: uv could not install envs/requirements.lock; pip installs it" >&2; return 1; }
  }

  # pip byte-compiles what it installs (half of its 160 s here). Kept: where PYTHONDONTWRITEBYTECODE is
  # set (this machine's shells set it), Python caches no module itself, and every process would compile
  # torch's modules again: with --no-compile `bash .ci/run` took 82 minutes instead of 50.
  install_with_pip() {
    local root=$1 venv=$2
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -c "$root/envs/requirements.lock" \
      -r "$root/envs/requirements.txt" -r "$root/envs/requirements-dev.txt" 2>&1 | grep -v "^WARNING: Location" >&2 || true
  }

  root=$1
  venv="$root/.venv"
  python="${PYTHON:-python3.11}"
  command -v "$python" >/dev/null 2>&1 || python=python3
  stamp="$venv/.requirements.sha256"
  want="$(cat "$root/envs/requirements.txt" "$root/envs/requirements-dev.txt" "$root/envs/requirements.lock" \
    "$root/pyproject.toml" | sha256sum | cut -d' ' -f1)"

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
    echo "bootstrap: installing envs/requirements.lock (torch is large: a few minutes the first time)" >&2
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip 2>/dev/null || true
    install_with_uv "$root" "$venv" || install_with_pip "$root" "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps -e "$root" 2>&1 \
      | grep -v "^WARNING: Location" >&2 || true
    "$venv/bin/python" -c "import torch, torchvision, snakemake, pandas, matplotlib, scalestudy" \
      || { echo "bootstrap: the environment in $venv is incomplete (see the messages above)" >&2; exit 1; }
    echo "$want" > "$stamp"
  fi
  # The editable scalestudy package is compiled here, not by pip: under PYTHONDONTWRITEBYTECODE each
  # process (rule, rank, Slurm job) compiled the 40-odd modules it imports, 0.5 s of a trainer's start.
  # Only what changed since the last call is compiled again.
  "$venv/bin/python" -m compileall -q "$root/scalestudy" >/dev/null || true
)

_scalestudy_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if _scalestudy_bootstrap "$_scalestudy_root"; then
  case ":$PATH:" in
    *":$_scalestudy_root/.venv/bin:"*) ;;
    *) export PATH="$_scalestudy_root/.venv/bin:$PATH" ;;
  esac
  export VIRTUAL_ENV="$_scalestudy_root/.venv"
  unset -f _scalestudy_bootstrap
  unset _scalestudy_root
else
  _scalestudy_status=$?
  unset -f _scalestudy_bootstrap
  unset _scalestudy_root
  # `return` where sourced (the caller's shell stays open), `exit` where run as a script.
  # shellcheck disable=SC2317
  return "$_scalestudy_status" 2>/dev/null || exit "$_scalestudy_status"
fi
