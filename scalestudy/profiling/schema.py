"""The one summary schema every profiling tool is parsed into (pure standard library).

Per world size, `results/profile/w{world}/`:

- `breakdown.csv` (BREAKDOWN_COLUMNS): one row per rank and category. `time_s` is the time of the
  category over the whole profiled window (`steps` steps, `window_s` seconds of wall time);
  `fraction` is its share, so a rank's fractions sum to 1. Communication is the *exposed* part
  (not hidden under compute; see `overlap.csv`); idle/other is what the other categories leave of
  the window (clipped at 0), and holds unknown kernels, runtime overhead and GPU idle time.
- `top_kernels.csv` (TOP_KERNEL_COLUMNS): the heaviest kernels (nsys) or ops (torch) per rank.
- `overlap.csv` (OVERLAP_COLUMNS): compute vs communication time and how much of it overlapped.

Every row carries the tool that produced it (`nsys` or `torch`) and the method (METHODS).
The ncu table (`ncu_kernels.csv`, NCU_COLUMNS) holds achieved throughput in % of peak per kernel.
"""

from __future__ import annotations

# Category keys, in the order the figures stack them.
CONV_GEMM = "conv_gemm"
NORM_ELEMENTWISE = "norm_elementwise"
COMM = "communication"
MEMCPY = "memory_copy"
DATA = "data_loading"
IDLE_OTHER = "idle_other"
# Kernels/ops no rule recognises; their time is part of idle/other in the breakdown.
OTHER = "other"

CATEGORIES = (CONV_GEMM, NORM_ELEMENTWISE, COMM, MEMCPY, DATA, IDLE_OTHER)
LABELS = {
    CONV_GEMM: "convolution/GEMM",
    NORM_ELEMENTWISE: "normalisation+elementwise",
    COMM: "communication (exposed)",
    MEMCPY: "memory copy",
    DATA: "data loading",
    IDLE_OTHER: "idle/other",
    OTHER: "other",
}
# Names of a kernel's or op's category (its time is not "exposed" or "idle").
KERNEL_LABELS = {**LABELS, COMM: "communication", OTHER: "other (unknown)"}

# How the numbers were obtained (the `method` column).
METHODS = {
    "nsys_trace": "nsys kernel/memcpy/NVTX summaries; overlap exact from the GPU kernel trace",
    "nsys_summary": "nsys summaries only; overlap is the lower bound (no GPU trace exported)",
    "torch_cpu": "torch.profiler self CPU time per op; overlap is the lower bound",
    "torch_device": "torch.profiler self device time per kernel; overlap is the lower bound",
}

# The trainer's named ranges (scalestudy.train.ranges): one `step` range per training step, holding
# `data`, `forward`, `backward` and `optimizer`; `eval` around evaluation.
STEP_RANGE = "step"
DATA_RANGE = "data"
NAMED_RANGES = ("data", "forward", "backward", "optimizer", "step", "eval")

BREAKDOWN_COLUMNS = (
    "world_size",
    "rank",
    "tool",
    "method",
    "category",
    "label",
    "time_s",
    "fraction",
    "time_per_step_s",
    "steps",
    "window_s",
)
TOP_KERNEL_COLUMNS = (
    "world_size",
    "rank",
    "tool",
    "kind",
    "position",
    "name",
    "category",
    "total_time_s",
    "instances",
    "avg_time_s",
    "fraction_of_busy",
)
OVERLAP_COLUMNS = (
    "world_size",
    "rank",
    "tool",
    "method",
    "compute_s",
    "communication_s",
    "overlap_s",
    "exposed_communication_s",
    "overlap_fraction",
    "steps",
    "window_s",
)
NCU_COLUMNS = (
    "tool",
    "id",
    "name",
    "category",
    "duration_s",
    "compute_pct_of_peak",
    "memory_pct_of_peak",
    "dram_pct_of_peak",
    "achieved_occupancy_pct",
    "grid_size",
    "block_size",
    "registers_per_thread",
)

# Files of the stage (relative to results/profile/w{world}/).
BREAKDOWN_FILE = "breakdown.csv"
TOP_KERNELS_FILE = "top_kernels.csv"
OVERLAP_FILE = "overlap.csv"
