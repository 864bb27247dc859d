#!/usr/bin/env bash
# The one-GPU study through Snakemake on a GPU machine, then its check (scripts/gpu_check.sh's step
# `study`; at most ~7 minutes on one H100 or H200, each part time-limited: 330 s, 90 s):
#   1. a fresh copy of the workflow in OUT_DIR/workflow runs
#      `python -m snakemake --profile profiles/local --configfile config/gpu-one.yaml`: its results/
#      and .snakemake/ land there, never in the repository's results/;
#   2. the benchmark's project trainer at the strong 1-GPU point's settings (studycheck bench-args;
#      compiled as the config compiles) against the reference trainer:
#      `python -m scalestudy.benchmark --device cuda --sections training ...`;
#   3. `python -m scalestudy.benchmark.studycheck check`: no two training jobs overlapped on the GPU,
#      no point contended, the strong 1-GPU point within 10 % of the benchmark row, convolution
#      kernels in the ncu table, no CUDA graph skipped (docs/guide/benchmarks.md, "One-GPU study through
#      Snakemake"); and the project trainer against the reference.
# OUT_DIR then holds snakemake.log, benchmark.csv/.log, check.txt and study-results.tar.gz.
#
#   bash scripts/gpu_study.sh [OUT_DIR]     # default bench-out/gpu/study
#
# A machine without Snakemake needs the bundle built beforehand on a machine with PyPI and this
# venv (bash scripts/gpu_bundle.sh -> .gpu-bundle/, carried with the working tree): it goes on
# PYTHONPATH here. PYTHON picks the interpreter (default: .venv/bin/python, else python3);
# GPU_BUNDLE the bundle folder; STUDY_LIMIT_S, STUDY_BENCH_LIMIT_S the parts' limits; STUDY_TARGETS=verdicts
# asks Snakemake only for what the verdicts read (the run catalog and the ncu table: every training
# run, no figures, paper or crate), other words are the targets themselves. check.txt ends with `study wall N s` (the Snakemake run's). To try the
# script itself on a CPU: STUDY_CONFIG=config/demo.yaml STUDY_DEVICE=cpu STUDY_BENCH_ARGS="--steps 3
# --repeats 1" (its verdicts then say what a CPU demo is: jobs side by side, no GPU monitor).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo=$PWD
out="${1:-bench-out/gpu/study}"
mkdir -p "$out" && out="$(cd "$out" && pwd)"
python="${PYTHON:-$([ -x .venv/bin/python ] && echo "$repo/.venv/bin/python" || echo python3)}"
bundle="${GPU_BUNDLE:-$repo/.gpu-bundle}"
config="${STUDY_CONFIG:-config/gpu-one.yaml}"
export PYTHONUNBUFFERED=1
# The rules call `python`: the interpreter's own folder first (a venv's holds `python` beside `python3`)
export PATH="$(dirname "$(command -v "$python")"):$PATH"
if [ -d "$bundle" ] && ! "$python" -c "import snakemake, jsonschema" 2>/dev/null; then
  export PYTHONPATH="$bundle${PYTHONPATH:+:$PYTHONPATH}"  # only where missing: it is built for another Python
fi
if ! "$python" -c "import snakemake, jsonschema" 2>/dev/null; then
  echo "gpu_study: $python has no Snakemake or jsonschema and there is no bundle at $bundle:"
  echo "  build it where PyPI and the venv are (bash scripts/gpu_bundle.sh) and carry .gpu-bundle/"
  exit 2
fi
"$python" -m snakemake --version | sed 's/^/snakemake /'

status=0
timed() {  # timed LIMIT_S LOG COMMAND...: COMMAND under a time limit, its output to LOG
  local limit=$1 log=$2 start=$SECONDS
  shift 2
  echo "--- $(date -u +%H:%M:%S) (limit ${limit}s): $*"
  timeout --signal=TERM --kill-after=20 "$limit" "$@" >"$log" 2>&1
  local code=$?
  echo "--- exit $code after $((SECONDS - start)) s (log: $log)"
  [ "$status" -ne 0 ] || status=$code  # the first failure decides
  return "$code"
}

rm -rf "$out/workflow" && mkdir -p "$out/workflow"
cp -r Snakefile rules config report profiles scalestudy containers envs examples "$out/workflow/"
cd "$out/workflow"
# --keep-going: one failed job (ncu without counters, say) must not cost the rest of the study
targets=()  # targets before --configfile, which takes several values (shared/FACTS.md)
if [ "${STUDY_TARGETS:-}" = verdicts ]; then
  targets=(results/tables/runs.csv results/profile/w1/ncu_status.json results/profile/w1/ncu_kernels.csv)
elif [ -n "${STUDY_TARGETS:-}" ]; then  # named files: part of the study (the ncu table alone, say)
  read -ra targets <<<"$STUDY_TARGETS"
fi
study_start=$SECONDS
timed "${STUDY_LIMIT_S:-330}" "$out/snakemake.log" \
  "$python" -m snakemake --profile profiles/local --keep-going "${targets[@]}" --configfile "$config"
study_wall=$((SECONDS - study_start))
tail -n 60 "$out/snakemake.log" | grep -E "Job stats|^total|steps \(|Error|error|Finished|Complete log" || true

strong=results/runs/scaling/strong/w1_r0
if [ -f "$strong/summary.json" ]; then
  mapfile -t options < <("$python" -m scalestudy.benchmark.studycheck bench-args --run-dir "$strong")
  timed "${STUDY_BENCH_LIMIT_S:-100}" "$out/benchmark.log" \
    "$python" -m scalestudy.benchmark --device "${STUDY_DEVICE:-cuda}" --sections training --config "$config" \
    "${options[@]}" ${STUDY_BENCH_ARGS:---steps 150 --repeats 2} --out "$out/benchmark.csv"
  tail -n 12 "$out/benchmark.log"
else
  echo "--- no $strong/summary.json: the benchmark comparison is skipped (the check says so)"
fi

"$python" -m scalestudy.benchmark.studycheck check --results results --benchmark "$out/benchmark.csv" \
  | tee "$out/check.txt"
check=${PIPESTATUS[0]}
echo "study wall $study_wall s" | tee -a "$out/check.txt"
[ "$status" -ne 0 ] || status=$check

# The results to take home, small: tables, figures, run folders, profiles, logs; not the data, the
# checkpoints or ncu's report (OUT_DIR/study-results.tar.gz, a few MB).
tar -czf "$out/study-results.tar.gz" --exclude='results/data/*.npy' --exclude='results/data/*.tar.gz' \
  --exclude='results/checkpoints' --exclude='*.ncu-rep' --exclude='results/inductor-cache' \
  --exclude='results/compile/*/artifacts.bin' \
  results .snakemake/log 2>/dev/null
ls -l "$out/study-results.tar.gz" 2>/dev/null
exit "$status"
