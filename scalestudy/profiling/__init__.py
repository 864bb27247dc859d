"""Profiling stage: Nsight Systems per rank, Nsight Compute kernels, the torch.profiler fallback.

Every tool's output is parsed into one summary schema (see `schema`): a per-rank breakdown of the
profiled window into categories, the top kernels (or ops), and the overlap of compute and
communication. Command-line entry points (each `python -m scalestudy.profiling.<module> --help`):

- `run`: the profiled training run; resolves the tool (auto -> nsys or torch) and records it.
- `nsys`: `nsys stats` exports per rank (kernel, NVTX, memcpy summaries and the GPU trace).
- `ncu`: Nsight Compute on a one-GPU run, exported with `--page raw` and parsed.
- `summarize`: one world size's tables; `combine`: the tables of all world sizes.
- `figures`: step-time breakdown bars, the top-kernels table, the ncu throughput scatter.
"""
