#!/usr/bin/env bash
# The one prepared command for a GPU node (issues 41, 51): at most 9 minutes (GPU_CHECK_BUDGET_S=540),
# every part time-limited, everything written into OUT_DIR (default docs/measurements/<device>-<date>,
# the device from nvidia-smi, e.g. h100, else `cpu`; the date in UTC):
#   node      (always, ~10 s) nvidia-smi, torch, CUDA, cuDNN, NCCL -> node.txt;
#   study     (limit 435 s) the one-GPU study (config/gpu-one.yaml: compiled points with CUDA graphs)
#             through Snakemake in its own copy of the workflow, only what the verdicts read (the run
#             catalog and the ncu table: no figures, paper or crate; 330 s, target 300 s), the ResNet
#             benchmark at its strong point: the study's compiled step vs the reference trainer, 2
#             repeats (90 s), and the verdicts -> study-check.txt, its last line `study wall N s`;
#             study/ keeps the logs, benchmark.csv and study-results.tar.gz (scripts/gpu_study.sh);
#             runs.csv is the study's run catalog;
#   lm        (limit 210 s) GPT-2 small, bf16, DDP vs FSDP2 at one rank, 10 + 100 steps, 3 interleaved
#             repeats -> lm.csv (GPU_CHECK_LM_ARGS replaces the arguments, GPU_CHECK_LM_LIMIT_S the limit);
#   variants  (limit 150 s) eager vs Inductor's CUDA graphs (compiled-cudagraphs) vs the eager step
#             captured whole (captured) at batch 512, 2 rounds -> variants.csv: the device run decides
#             between the two graphs (scalestudy.benchmark.variants, .captured);
#   targets   (always, seconds) issue 51's GPU numbers, met or not, and the variants' decision ->
#             targets.txt (scalestudy.benchmark.targets);
#   tests, benchmark: tests/test_gpu.py (270 s) and the full ResNet benchmark (190 s).
# By default the parts are "study lm variants": a part whose limit no longer fits in what is left of
# the budget is not started, and said so (the variants, after a study and the LM, usually: then a
# second call, GPU_CHECK_STEPS=variants). tests and benchmark only when named.
#
#   bash scripts/gpu_check.sh [OUT_DIR]
#
# GPU_CHECK_STEPS picks the parts, GPU_CHECK_STUDY_LIMIT_S the study's limit. With GPU_CHECK_COPY_TO
# (the device tool's $OUT) the folder is also packed into GPU_CHECK_COPY_TO/measurements.tar.gz with
# study-check.txt, targets.txt and the CSVs beside it (what comes back from a lent machine;
# docs/guide/gpu.md). The script goes on after a failed part; the exit status says whether any failed.
# PYTHON picks the interpreter (default .venv/bin/python, else python3); STUDY_DEVICE=cpu with
# GPU_CHECK_CPU_SMALL=1 runs every part at a tiny size on a CPU (the test; GPU_CHECK_LIMIT_SCALE
# multiplies every limit and the budget there). A machine without Snakemake needs .gpu-bundle/ (bash
# scripts/gpu_bundle.sh, beforehand); the study and the variants load the config with its jsonschema.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
python="${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# Snakemake and jsonschema for a machine that lacks them (scripts/gpu_bundle.sh): every step may use it.
# Only there: the bundle is built for the GPU machine's Python and would shadow this venv's own packages.
if [ -d .gpu-bundle ] && ! "$python" -c "import snakemake, jsonschema" 2>/dev/null; then
  export PYTHONPATH="$PWD/.gpu-bundle:$PYTHONPATH"
fi

device_label() {  # h100, h200, a100, ... from nvidia-smi's first GPU; cpu without one
  local name
  name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
  [ "${STUDY_DEVICE:-cuda}" != cpu ] && [ -n "$name" ] || { echo cpu; return; }
  local short
  short=$(echo "$name" | tr 'A-Z' 'a-z' | grep -oE '\b[a-z]{1,2}[0-9]{2,4}[a-z]?\b' | head -n 1)
  echo "${short:-$(echo "$name" | tr 'A-Z ' 'a-z-' | tr -cd 'a-z0-9-')}"
}

out="${1:-docs/measurements/$(device_label)-$(date -u +%Y-%m-%d)}"
mkdir -p "$out"
scale=${GPU_CHECK_LIMIT_SCALE:-1}  # every limit and the budget x this (a loaded CPU's test: slower starts)
budget=$((${GPU_CHECK_BUDGET_S:-540} * scale))
device=${STUDY_DEVICE:-cuda}
failed=()
not_run=()

step() {  # step NAME LIMIT_S COMMAND...: runs COMMAND under a time limit, its output to OUT/NAME.log
  local name=$1 limit=$(($2 * scale))
  shift 2
  [[ " ${GPU_CHECK_STEPS:-study lm variants} " == *" $name "* ]] || return 0
  local left=$((budget - SECONDS))
  if [ "$limit" -gt "$left" ]; then
    echo "=== $name: not run: its limit ${limit}s is more than the ${left}s left of GPU_CHECK_BUDGET_S=$budget"
    not_run+=("$name")
    return 0
  fi
  echo "=== $name ($(date -u +%H:%M:%S), limit ${limit}s): $*"
  local start=$SECONDS
  timeout --signal=TERM --kill-after=15 "$limit" "$@" >"$out/$name.log" 2>&1
  local code=$?
  step_wall=$((SECONDS - start))
  echo "=== $name: exit $code after ${step_wall} s"
  [ "$code" -eq 0 ] || failed+=("$name")
}

describe_node() {
  nvidia-smi
  "$python" - <<'EOF'
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())
if torch.cuda.is_available():
    print("nccl", ".".join(map(str, torch.cuda.nccl.version())))
    print("device", torch.cuda.get_device_name(0), torch.cuda.get_device_properties(0))
EOF
  for tool in ncu nsys; do command -v "$tool" && "$tool" --version | tail -1; done
  return 0
}

# The parts' sizes: the GPU's, or (GPU_CHECK_CPU_SMALL=1) a CPU's tiny ones that exercise the same path
if [ "${GPU_CHECK_CPU_SMALL:-0}" = 1 ]; then
  variants_args=(--device cpu --variants eager,captured --batches 16 --repeats 1 --steps 2 --warmup 1)
  lm_args=(--preset demo --device cpu --precision fp32 --per-gpu-batch 2 --steps 2 --warmup 1 --repeats 1
    --parallelism ddp)
else
  variants_args=(--device "$device" --variants eager,compiled-cudagraphs,captured --batches 512 --repeats 2)
  # issue 51's measurement: at least 100 steps, 3 interleaved repeats (the LM benchmark's own defaults
  # otherwise: scalestudy.benchmark.lm)
  lm_args=(--preset gpt2-small --device "$device" --precision bf16 --steps 100 --warmup 10 --repeats 3)
fi
if [ -n "${GPU_CHECK_LM_ARGS:-}" ]; then read -ra lm_args <<<"$GPU_CHECK_LM_ARGS"; fi

echo "=== $(date -u +%FT%TZ) into $out (budget ${budget}s)"
echo "=== node -> $out/node.txt"
start=$SECONDS
describe_node >"$out/node.txt" 2>&1
echo "=== node: $((SECONDS - start)) s"
step_wall=
export STUDY_LIMIT_S=${STUDY_LIMIT_S:-$((330 * scale))} STUDY_BENCH_LIMIT_S=${STUDY_BENCH_LIMIT_S:-$((90 * scale))}
export STUDY_TARGETS=${STUDY_TARGETS:-verdicts} STUDY_DEVICE=$device
step study "${GPU_CHECK_STUDY_LIMIT_S:-435}" bash scripts/gpu_study.sh "$out/study"
if [ -n "$step_wall" ]; then  # the verdicts, ending with the study's wall time (`study wall N s`)
  cp "$out/study/check.txt" "$out/study-check.txt" 2>/dev/null ||
    echo "FAIL  study: no verdicts after ${step_wall} s (study.log)" >"$out/study-check.txt"
  cp "$out/study/workflow/results/tables/runs.csv" "$out/runs.csv" 2>/dev/null
fi
step lm "${GPU_CHECK_LM_LIMIT_S:-210}" "$python" -m scalestudy.benchmark.lm "${lm_args[@]}" --out "$out/lm.csv"
step variants 150 "$python" -m scalestudy.benchmark.variants "${variants_args[@]}" --budget-s $((140 * scale)) \
  --out "$out/variants.csv"
step tests 270 "$python" -m pytest -p no:cacheprovider -rs -s --durations=0 tests/test_gpu.py
step benchmark 190 "$python" -m scalestudy.benchmark --device "$device" --sections matmul,pipeline,training \
  --precisions "${BENCH_PRECISIONS:-fp32,bf16}" --repeats 2 --out "$out/benchmark.csv"

tail -n 25 "$out/node.txt" 2>/dev/null
for log in variants lm benchmark; do [ -f "$out/$log.log" ] && tail -n 14 "$out/$log.log"; done
grep -E "passed|failed|skipped|images/s|ncu:" "$out/tests.log" 2>/dev/null | tail -n 20
cat "$out/study-check.txt" 2>/dev/null
echo "=== targets (issue 51) -> $out/targets.txt"
"$python" -m scalestudy.benchmark.targets --folder "$out" || echo "targets: could not be read (see above)"
if [ -n "${GPU_CHECK_COPY_TO:-}" ]; then  # what comes back from a lent machine: at most 8 files
  mkdir -p "$GPU_CHECK_COPY_TO"
  tar -czf "$GPU_CHECK_COPY_TO/measurements.tar.gz" --exclude='study/workflow' -C "$(dirname "$out")" \
    "$(basename "$out")"
  cp "$out"/study-check.txt "$out"/targets.txt "$out"/*.csv "$GPU_CHECK_COPY_TO/" 2>/dev/null
  ls -l "$GPU_CHECK_COPY_TO"
fi
[ ${#not_run[@]} -eq 0 ] || echo "gpu_check: not run (GPU_CHECK_BUDGET_S): ${not_run[*]}"
echo "gpu_check: $SECONDS s in all"
if [ ${#failed[@]} -gt 0 ]; then
  echo "gpu_check: FAILED: ${failed[*]} (logs in $out)"
  exit 1
fi
echo "gpu_check: every step run passed (logs in $out)"
