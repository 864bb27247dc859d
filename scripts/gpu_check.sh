#!/usr/bin/env bash
# The checks only a GPU node can run, in one go, each step time-limited:
#   1. the node: nvidia-smi, torch, CUDA, cuDNN and NCCL versions, ncu and nsys if present;
#   2. study: the one-GPU study (config/gpu-one.yaml) through Snakemake in its own copy of the
#      workflow, the benchmark at its strong 1-GPU point, and the verdicts: no two training jobs
#      overlapped on the GPU, no point contended, the strong point within 10 % of the benchmark,
#      convolution kernels in the ncu table (scripts/gpu_study.sh; limit 530 s). A machine without
#      Snakemake needs .gpu-bundle/, built beforehand where PyPI is: bash scripts/gpu_bundle.sh;
#   3. tests/test_gpu.py: the trainer on CUDA at fp32/tf32/bf16/fp16 and compiled, with the NVML
#      monitor; the one-rank NCCL group; the GPT under DDP and FSDP2 on NCCL; the node description
#      through NVML; Nsight Compute inside the trainer's NVTX step ranges (limit 270 s);
#   4. the ResNet benchmark (python -m scalestudy.benchmark --device cuda): matmul peak, data
#      pipeline, trainer vs reference trainer, against the GPU targets of docs/benchmarks.md (190 s);
#   5. the GPT-2 small benchmark (python -m scalestudy.benchmark.lm): tokens/s and MFU, DDP vs FSDP2
#      (100 s).
#
#   bash scripts/gpu_check.sh [OUT_DIR]    # default bench-out/gpu; logs and CSVs land there
#
# The steps run in that order while their limits fit in GPU_CHECK_BUDGET_S (default 570: one
# 10-minute command on a lent machine, the node's description and a margin included); a step whose
# limit no longer fits is not run, and said so. GPU_CHECK_STEPS picks a subset of "study tests
# benchmark lm" (on a lent machine: GPU_CHECK_STEPS=study, then "tests benchmark" in another call;
# on a node of your own: GPU_CHECK_BUDGET_S=1200 runs all four). The script goes on after a failed
# step; the exit status says whether any failed. PYTHON picks the interpreter (default:
# .venv/bin/python, else python3); BENCH_PRECISIONS the benchmark's (fp32,bf16).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${1:-bench-out/gpu}"
mkdir -p "$out"
python="${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# Snakemake and jsonschema for a machine that lacks them (scripts/gpu_bundle.sh): every step may use it
[ -d .gpu-bundle ] && export PYTHONPATH="$PWD/.gpu-bundle:$PYTHONPATH"
budget=${GPU_CHECK_BUDGET_S:-570}
failed=()
not_run=()

step() {  # step NAME LIMIT_S COMMAND...: runs COMMAND under a time limit, its output to OUT/NAME.log
  local name=$1 limit=$2
  shift 2
  [[ " ${GPU_CHECK_STEPS:-study tests benchmark lm} " == *" $name "* ]] || return 0
  local left=$((budget - SECONDS))
  if [ "$limit" -gt "$left" ]; then
    echo "=== $name: not run: its limit ${limit}s is more than the ${left}s left of GPU_CHECK_BUDGET_S=$budget"
    not_run+=("$name")
    return 0
  fi
  echo "=== $name ($(date -u +%H:%M:%S), limit ${limit}s): $*"
  local start=$SECONDS
  timeout --signal=TERM --kill-after=20 "$limit" "$@" >"$out/$name.log" 2>&1
  local code=$?
  echo "=== $name: exit $code after $((SECONDS - start)) s"
  [ "$code" -eq 0 ] || failed+=("$name")
}

describe_node() {
  nvidia-smi
  "$python" - <<'EOF'
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())
print("nccl", ".".join(map(str, torch.cuda.nccl.version())))
print("device", torch.cuda.get_device_name(0), torch.cuda.get_device_properties(0))
EOF
  for tool in ncu nsys; do command -v "$tool" && "$tool" --version | tail -1; done
  return 0
}

echo "=== node"
describe_node >"$out/node.log" 2>&1
step study 530 bash scripts/gpu_study.sh "$out/study"
step tests 270 "$python" -m pytest -p no:cacheprovider -rs -s --durations=0 tests/test_gpu.py
step benchmark 190 "$python" -m scalestudy.benchmark --device cuda --sections matmul,pipeline,training \
  --precisions "${BENCH_PRECISIONS:-fp32,bf16}" --repeats 2 --out "$out/benchmark.csv"
step lm 100 "$python" -m scalestudy.benchmark.lm --preset gpt2-small --device cuda --precision bf16 \
  --steps 50 --warmup 10 --repeats 1 --out "$out/lm.csv"
tail -n 25 "$out/node.log" "$out"/benchmark.log "$out"/lm.log 2>/dev/null
grep -E "passed|failed|skipped|images/s|ncu:" "$out/tests.log" 2>/dev/null | tail -n 20
cat "$out/study/check.txt" 2>/dev/null
[ ${#not_run[@]} -eq 0 ] || echo "gpu_check: not run (GPU_CHECK_BUDGET_S): ${not_run[*]}"
if [ ${#failed[@]} -gt 0 ]; then
  echo "gpu_check: FAILED: ${failed[*]} (logs in $out)"
  exit 1
fi
echo "gpu_check: every step run passed (logs in $out)"
