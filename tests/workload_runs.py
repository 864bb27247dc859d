"""Constructed run-catalog rows of several workloads and parallelisms that the analysis and figure tests
share (tests/test_workload_analysis.py, tests/test_workload_figures.py): a series of scaling runs of a
known efficiency, its scaling table, and a sensitivity sweep's rows."""

from __future__ import annotations

import pandas as pd

from scalestudy.analysis import metrics, settings
from scalestudy.analysis.constructed_study import run_row

SETTINGS = settings.resolved({})
MIB = 1 << 20
T1 = 0.2  # seconds per step on one rank


# ----------------------------------------------------------------------------- two series
def series_runs(parallelism: str, efficiency: float, state_bytes: float, repeats: int = 1) -> list[dict]:
    """Strong scaling at a known efficiency, with memory that FSDP shards and DDP replicates."""
    rows = []
    for n in (1, 2, 4):
        step = T1 if n == 1 else T1 / (efficiency * n)
        for r in range(repeats):
            row = run_row("scaling", n, 64 // n, step, mode="strong", repeat=r)
            sharded = state_bytes / n if parallelism == "fsdp" else state_bytes
            row.update(
                parallelism=parallelism,
                point=f"strong/{'' if parallelism == 'ddp' else 'fsdp-'}w{n}_r{r}",
                peak_memory_bytes=(100 + r) * MIB,  # median over repeats: the middle one
                model_state_bytes_per_rank=sharded,
                peak_memory_source="cpu_peak_rss",
                sample_unit="tokens",
            )
            rows.append(row)
    return rows


def scaling_of(rows) -> pd.DataFrame:
    return metrics.scaling_table(metrics.run_metrics(pd.DataFrame(rows), SETTINGS), SETTINGS)


def sweep_rows(hooks=("none",)) -> list[dict]:
    rows = [run_row("baseline", 1, 16, 16 / 100.0)]
    for precision in ("fp32", "bf16"):
        for batch in (32, 16):
            for bucket in (25, 1):
                for hook in hooks:
                    rate = 100.0 * (1.5 if precision == "bf16" else 1) * batch / 16 * (1 + bucket / 100)
                    rate *= 1.1 if hook == "fp16_compress" else 1.0
                    extra = {
                        "config.precision": precision,
                        "config.bucket_cap_mb": bucket,
                        "config.comm_hook": hook,
                    }
                    rows.append(run_row("sensitivity", 2, batch, batch / rate, **extra))
    return rows
