"""The trainer's process: seeds, determinism, threads, fp32 math and the CUDA allocator for a run
(process_settings), the autocast dtype a device can run, the device's name, glibc's allocator
settings for CPU steps, and how the process ends (exit_now).

fp32 math: `precision: fp32` is IEEE fp32 on a GPU too. torch 2.14 runs cuDNN convolutions in TF32
by default (torch.backends.cudnn.conv.fp32_precision == "tf32"), which would make an "fp32"
ResNet run on tensor cores while its MFU divides by the non-tensor-core fp32 peak (~7x too high
on an H100). process_settings sets cuDNN's and cuBLAS's fp32 precision to "ieee" for every
precision but `tf32`, which sets both to "tf32" (its own peak in analysis.peak_tflops); fp32_math()
reads back what ran, for the summary. The autocast precisions (bf16, fp16) keep their fp32 ops
(outside autocast) in IEEE as well.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import platform
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from scalestudy.plan import runconfig

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}  # the others: no autocast
FP32_MATH = {"tf32": "tf32"}  # precision -> torch's fp32_precision for cuDNN and cuBLAS; else "ieee"
# FSDP2's all-gathered parameters come and go every step in varying sizes: expandable segments
# keep the caching allocator from fragmenting (PyTorch's FSDP2 recommendation); the environment's
# own PYTORCH_CUDA_ALLOC_CONF wins.
FSDP_ALLOC_CONF = "expandable_segments:True"
# Modules whose CUDA backward has no deterministic kernel: torch.use_deterministic_algorithms(True)
# raises at the first backward (torch's use_deterministic_algorithms documentation lists them).
NONDETERMINISTIC_CUDA_BACKWARD = (
    "AdaptiveAvgPool2d",
    "AdaptiveAvgPool3d",
    "AdaptiveMaxPool2d",
    "AvgPool3d",
    "MaxPool3d",
    "FractionalMaxPool2d",
    "FractionalMaxPool3d",
    "ReflectionPad1d",
    "ReflectionPad2d",
    "ReflectionPad3d",
    "ReplicationPad1d",
    "ReplicationPad2d",
    "ReplicationPad3d",
)

log = logging.getLogger("scalestudy.train")


@contextlib.contextmanager
def process_settings(config: dict[str, Any]):
    """Seeds, determinism and threads for this run; restored afterwards (tests run main in-process)."""
    saved = (
        torch.are_deterministic_algorithms_enabled(),
        torch.get_num_threads(),
        torch.backends.cudnn.benchmark,
        torch.backends.cudnn.benchmark_limit,
        fp32_math(),
        os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
    )
    set_fp32_math(FP32_MATH.get(config["precision"], "ieee"))
    if config.get("parallelism") == "fsdp":
        use_expandable_segments()
    if config["deterministic"]:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before cuBLAS starts
        torch.use_deterministic_algorithms(True)
        torch.set_num_threads(1)  # the same reduction order in every run
    # autotuning only where asked: its trials are seconds of every job's first step (issue 41)
    autotune = config.get("cudnn_benchmark", runconfig.DEFAULTS["cudnn_benchmark"])
    torch.backends.cudnn.benchmark = bool(autotune) and not config["deterministic"]
    # and bounded: the best-ranked algorithms only (issue 51)
    torch.backends.cudnn.benchmark_limit = config.get(
        "cudnn_benchmark_limit", runconfig.DEFAULTS["cudnn_benchmark_limit"]
    )
    seed_everything(config["seed"])
    try:
        yield
    finally:
        if torch.are_deterministic_algorithms_enabled() != saved[0]:  # its call imports torch._inductor
            torch.use_deterministic_algorithms(saved[0])
        torch.set_num_threads(saved[1])
        torch.backends.cudnn.benchmark = saved[2]
        torch.backends.cudnn.benchmark_limit = saved[3]
        set_fp32_math(saved[4]["cudnn_conv"], saved[4]["cudnn_rnn"], saved[4]["cuda_matmul"])
        _restore_environ("PYTORCH_CUDA_ALLOC_CONF", saved[5])


def _restore_environ(key: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(key, None)
    else:
        os.environ[key] = value


def fp32_math() -> dict[str, str]:
    """How fp32 convolutions, RNNs and matmuls run on a GPU ("ieee", "tf32"; "none": torch's
    default, IEEE for matmuls), as torch's fp32_precision settings say (recorded in summary.json)."""
    return {
        "cudnn_conv": torch.backends.cudnn.conv.fp32_precision,
        "cudnn_rnn": torch.backends.cudnn.rnn.fp32_precision,
        "cuda_matmul": torch.backends.cuda.matmul.fp32_precision,
    }


def set_fp32_math(conv: str, rnn: str | None = None, matmul: str | None = None) -> None:
    """torch's fp32_precision of cuDNN convolutions, RNNs (default: as conv) and cuBLAS matmuls
    (default: as conv). Only the new API: mixing it with allow_tf32 raises in torch 2.14."""
    torch.backends.cudnn.conv.fp32_precision = conv
    torch.backends.cudnn.rnn.fp32_precision = rnn or conv
    torch.backends.cuda.matmul.fp32_precision = matmul or conv


def effective_precision(precision: str, amp_dtype: torch.dtype | None) -> str:
    """The precision that ran: `precision`, or fp32 where autocast could not run its dtype."""
    return precision if AUTOCAST_DTYPES.get(precision) == amp_dtype else "fp32"


def use_expandable_segments() -> None:
    """FSDP_ALLOC_CONF for the CUDA caching allocator, unless PYTORCH_CUDA_ALLOC_CONF is set: in the
    environment (read when the allocator starts) and, where CUDA has started, set now as well."""
    if os.environ.get("PYTORCH_CUDA_ALLOC_CONF"):
        return
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = FSDP_ALLOC_CONF
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        # what torch.cuda.memory._set_allocator_settings calls, without its FutureWarning (torch
        # 2.11 on an H100 printed it in every FSDP2 run; 2.14 deprecates it too)
        torch._C._accelerator_setAllocatorSettings(FSDP_ALLOC_CONF)


def check_deterministic(model: torch.nn.Module, config: dict[str, Any], device: torch.device) -> None:
    """RunConfigError before training where `deterministic: true` cannot run on `device`: a module
    whose CUDA backward has no deterministic kernel (the ResNet's AdaptiveAvgPool2d) would raise at
    the first backward step."""
    if not config["deterministic"] or device.type != "cuda":
        return
    found = sorted({type(m).__name__ for m in model.modules()} & set(NONDETERMINISTIC_CUDA_BACKWARD))
    if found:
        from scalestudy.plan.runconfig import RunConfigError

        raise RunConfigError(
            f"run config deterministic=true cannot run {config['workload']} on {device}: the CUDA "
            f"backward of {', '.join(found)} has no deterministic kernel (torch.use_deterministic_"
            "algorithms would raise at the first step); set deterministic: false or device: cpu"
        )


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also every CUDA device


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype for `precision`, or None (fp32) with a warning if the device cannot run it.

    The probe is a matmul: a convolution would load cuDNN (and time its algorithms under
    cudnn.benchmark) in a job that may have no convolution at all (the GPT; issue 51)."""
    dtype = AUTOCAST_DTYPES.get(precision)
    if dtype is None:
        return None
    try:
        with torch.autocast(device.type, dtype=dtype):
            probe = torch.ones(4, 4, device=device)
            (probe @ probe).sum()
    except (RuntimeError, AssertionError) as error:
        log.warning(
            "precision=%s: autocast cannot run %s on %s (%s); training in fp32",
            precision,
            dtype,
            device,
            error,
        )
        return None
    return dtype


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def exit_now(code: int) -> None:
    """Flush and end the process without freeing the trainer or the interpreter's teardown.

    Every output is written (atomically) and the process group is gone by now. After a
    torch.profiler window in a multi-rank run, glibc sometimes aborts in a native thread that
    exits when the trainer's objects are freed ("tcache_thread_shutdown(): unaligned tcache chunk
    detected": 3 of 32 two-rank CPU profile runs of the demo before this, 0 of 30 after), which
    would turn a finished run into a failed job.
    """
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


# glibc's mallopt parameters (<malloc.h>) and the largest mmap threshold it accepts on 64-bit.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD_MAX = 32 << 20


def keep_freed_host_memory() -> None:
    """Let glibc keep freed activation buffers for the next step instead of unmapping them.

    Blocks above the mmap threshold (most activations of a batch) get a fresh mmap each and are
    unmapped on free, so every CPU step faults its activation pages in again: measured 971 -> 1,077
    img/s (+11 %) for the demo model on 2 cores. Process-wide, so only the command line calls it.
    """
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return  # not glibc: nothing to tune
    mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX)
    mallopt(M_TRIM_THRESHOLD, 32 * MMAP_THRESHOLD_MAX)
