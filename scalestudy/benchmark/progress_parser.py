"""Benchmark row: peak memory of the command workload's progress parser on a long run.

    python -m scalestudy.benchmark.progress_parser [--lines 1000000] [--out row.json]

Writes a progress file of `--lines` step lines as the contract's Reporter writes them (two
attempts, the second repeating the last 1 % of steps, an epoch line every 10,000 steps), then
parses it as rank 0's runner does (read_progress, step_results, epoch_rows, step_columns) and
reports the growth of the process's peak RSS over the parse with its wall time, and the peak of
Python's allocations during a second parse (tracemalloc). The limit (issue 23): under 100 MB for 1e6
lines (the parser held the whole file as dicts: 1.65 GB).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

from scalestudy.workloads.command import progress as command_progress

LIMIT_BYTES = 100 * 1024**2
CONFIG = {
    "world_size": 1,
    "global_batch": 64,
    "per_gpu_batch": 64,
    "epochs": 1,
    "measure_warmup_steps": 10,
    "measure_steps": 100,
    "measure_intervals": 4,
}


def write_file(path: Path, lines: int) -> int:
    """A progress file of `lines` step lines; its size in bytes."""
    repeat = max(lines // 100, 1)
    first = lines - repeat
    t = 1.7e9
    with open(path, "w", encoding="utf-8") as handle:
        for attempt, steps in enumerate((range(first), range(first - repeat, first))):
            handle.write(json.dumps({"event": "attempt", "time": t, "attempt": attempt + 1}) + "\n")
            for step in steps:
                t += 0.01
                line = {"event": "step", "step": step, "samples": 64, "seconds": 0.01, "loss": 2.5, "time": t}
                handle.write(json.dumps(line) + "\n")
                if (step + 1) % 10_000 == 0:
                    handle.write(
                        json.dumps({"event": "epoch", "epoch": (step + 1) // 10_000, "end_step": step + 1})
                        + "\n"
                    )
    return path.stat().st_size


def parse(path: Path) -> int:
    """What rank 0's runner does with the file; the number of distinct steps."""
    progress = command_progress.read_progress(path)
    results = command_progress.step_results(progress, CONFIG, t0=None)
    command_progress.epoch_rows(progress, CONFIG)
    command_progress.step_columns(progress)
    return results["steps"]


def measure(path: Path) -> dict:
    """Two parses: one timed, with the peak RSS growth; one under tracemalloc (slower)."""
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    t0 = time.perf_counter()
    steps = parse(path)
    seconds = time.perf_counter() - t0
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    tracemalloc.start()
    parse(path)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {
        "steps": steps,
        "parse_s": round(seconds, 2),
        "tracemalloc_peak_bytes": peak,
        "peak_rss_growth_bytes": rss_after - rss_before,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scalestudy.benchmark.progress_parser")
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--out", type=Path, default=None, help="also write the row as JSON here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "progress-rank0.jsonl"
        size = write_file(path, args.lines)
        row = {"benchmark": "progress_parser", "lines": args.lines, "file_bytes": size, **measure(path)}
    row["under_limit"] = max(row["tracemalloc_peak_bytes"], row["peak_rss_growth_bytes"]) < LIMIT_BYTES
    text = json.dumps(row)
    print(text)
    if args.out:
        from scalestudy import atomic

        atomic.write_text(args.out, text + "\n")
    return 0 if row["under_limit"] else 1


if __name__ == "__main__":
    sys.exit(main())
