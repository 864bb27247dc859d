"""The trainer's process: seeds, determinism and threads for a run (process_settings), the autocast
dtype a device can run, the device's name, glibc's allocator settings for CPU steps, and how the
process ends (exit_now)."""

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
import torch.nn.functional as F

AUTOCAST_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}

log = logging.getLogger("scalestudy.train")


@contextlib.contextmanager
def process_settings(config: dict[str, Any]):
    """Seeds, determinism and threads for this run; restored afterwards (tests run main in-process)."""
    saved = (
        torch.are_deterministic_algorithms_enabled(),
        torch.get_num_threads(),
        torch.backends.cudnn.benchmark,
    )
    if config["deterministic"]:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before cuBLAS starts
        torch.use_deterministic_algorithms(True)
        torch.set_num_threads(1)  # the same reduction order in every run
    torch.backends.cudnn.benchmark = not config["deterministic"]
    seed_everything(config["seed"])
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(saved[0])
        torch.set_num_threads(saved[1])
        torch.backends.cudnn.benchmark = saved[2]


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also every CUDA device


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype for `precision`, or None (fp32) with a warning if the device cannot run it."""
    dtype = AUTOCAST_DTYPES[precision]
    if dtype is None:
        return None
    try:
        with torch.autocast(device.type, dtype=dtype):
            probe = torch.ones(1, 1, 4, 4, device=device)
            F.conv2d(probe, torch.ones(1, 1, 3, 3, device=device)).sum()
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
