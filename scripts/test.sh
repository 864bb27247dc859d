#!/usr/bin/env bash
# README command 2 (and CI's): install everything (first run), lint, and run the whole test suite.
# The Slurm tests bring up a throw-away Slurm cluster on this machine (root and apt needed; they
# skip with the reason otherwise). Extra arguments go to pytest, e.g. `-m "not slurm"`.
#
# Without arguments the suite runs as two pytest sessions side by side: the Slurm tests (marked
# `slurm`: one cluster at a time, one test at a time) and the rest on two pytest-xdist workers, one
# test module per worker at a time (its module fixtures built once). Three streams of tests keep
# both cores busy while one waits for a process, a signal or the scheduler's polling. The Slurm
# tests' report follows the other's; the exit status is the worse of the two. Each session ends with
# its wall time, CPU-seconds and 20 costliest test phases (tests/cputime.py), and the last line adds
# the two sessions up, so that a creeping cost shows at once.
# SCALESTUDY_TEST_SERIAL=1 runs one session, as with arguments.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# Debian's Slurm, TeX and Chromium for the tests that need them, installed beside the venv (a fresh
# machine spends minutes on them); done before any test starts, so none sees half a package.
packages_log="$(mktemp)"
bash tests/system_packages.sh >"$packages_log" 2>&1 &
packages=$!
source scripts/bootstrap.sh
# Where PYTHONDONTWRITEBYTECODE is set (this machine's shells), pytest keeps no rewritten test module:
# each pytest process (two workers, the Slurm session, the probes some tests start) rewrote all of
# them again, 6 of its 15 CPU-s of collection here. Byte code may be cached while the tests run.
unset PYTHONDONTWRITEBYTECODE
ruff check .
ruff format --check .
# the Snakefile and rules/ formatted as the Snakemake workflow template's CI checks them ([tool.snakefmt])
snakefmt --check Snakefile rules
snakemake --lint --profile profiles/local
# On a fresh machine the packages take longer than the venv (Slurm, TeX and Chromium ~2 min; uv ~1)
wait "$packages" || echo "test.sh: tests/system_packages.sh failed (log: $packages_log); the tests" \
  "that need a missing package install it themselves or skip" >&2
if [ $# -gt 0 ] || [ "${SCALESTUDY_TEST_SERIAL:-0}" = 1 ]; then
  exec python -m pytest -ra "$@"
fi
temp="$(mktemp -d)"
trap 'rm -rf "$temp"' EXIT
echo "test.sh: the Slurm tests run beside the others; their report follows (log: $temp/slurm.log)"
host_before="$(python -c 'from tests.cputime import host_cpu; print(host_cpu() or 0)')"
SCALESTUDY_CPU_REPORT="$temp/cpu-slurm.json" \
  python -m pytest -ra --durations=20 -m slurm -p no:cacheprovider --basetemp "$temp/slurm" \
  >"$temp/slurm.log" 2>&1 &
slurm=$!
status=0
SCALESTUDY_CPU_REPORT="$temp/cpu-rest.json" \
  python -m pytest -ra --durations=20 -n 2 --dist loadfile -m "not slurm" \
  --basetemp "$temp/rest" || status=$?
slurm_status=0
wait "$slurm" || slurm_status=$?
echo "======================= the Slurm tests (-m slurm) ======================="
cat "$temp/slurm.log"
# Each session printed its own cost (tests/cputime.py); this is both together
python -m tests.cputime "$host_before" "$temp/cpu-rest.json" "$temp/cpu-slurm.json" || true
# pytest exits 5 when it selects no test: not a failure of the suite
[ "$slurm_status" -eq 5 ] && slurm_status=0
[ "$status" -eq 5 ] && status=0
exit $((status > slurm_status ? status : slurm_status))
