#!/usr/bin/env bash
# The checks only a GPU node can run, in one go (about 8 minutes on one H100, each step time-limited):
#   1. the node: nvidia-smi, torch, CUDA, cuDNN and NCCL versions, ncu and nsys if present;
#   2. tests/test_gpu.py: the trainer on CUDA at fp32/tf32/bf16/fp16 and compiled, with the NVML
#      monitor; the one-rank NCCL group; the GPT under DDP and FSDP2 on NCCL; the node description
#      through NVML; Nsight Compute inside the trainer's NVTX step ranges;
#   3. the ResNet benchmark (python -m scalestudy.benchmark --device cuda): matmul peak, data
#      pipeline, trainer vs reference trainer, against the GPU targets of docs/benchmarks.md;
#   4. the GPT-2 small benchmark (python -m scalestudy.benchmark.lm): tokens/s and MFU, DDP vs FSDP2.
#
#   bash scripts/gpu_check.sh [OUT_DIR]    # default bench-out/gpu; logs and CSVs land there
#
# Each step has its own time limit and the script goes on after a failed one; the exit status says
# whether any failed. PYTHON picks the interpreter (default: .venv/bin/python, else python3);
# GPU_CHECK_STEPS a subset of "tests benchmark lm"; BENCH_PRECISIONS the benchmark's (fp32,bf16).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${1:-bench-out/gpu}"
mkdir -p "$out"
python="${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
failed=()

step() {  # step NAME LIMIT_S COMMAND...: runs COMMAND under a time limit, its output to OUT/NAME.log
  local name=$1 limit=$2
  shift 2
  [[ " ${GPU_CHECK_STEPS:-tests benchmark lm} " == *" $name "* ]] || return 0
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
step tests 270 "$python" -m pytest -p no:cacheprovider -rs -s --durations=0 tests/test_gpu.py
step benchmark 190 "$python" -m scalestudy.benchmark --device cuda --sections matmul,pipeline,training \
  --precisions "${BENCH_PRECISIONS:-fp32,bf16}" --repeats 2 --out "$out/benchmark.csv"
step lm 100 "$python" -m scalestudy.benchmark.lm --preset gpt2-small --device cuda --precision bf16 \
  --steps 50 --warmup 10 --repeats 1 --out "$out/lm.csv"
tail -n 25 "$out/node.log" "$out"/benchmark.log "$out"/lm.log 2>/dev/null
grep -E "passed|failed|skipped|images/s|ncu:" "$out/tests.log" 2>/dev/null | tail -n 20
if [ ${#failed[@]} -gt 0 ]; then
  echo "gpu_check: FAILED: ${failed[*]} (logs in $out)"
  exit 1
fi
echo "gpu_check: all steps passed (logs in $out)"
