"""Scaling metrics from the run catalog: throughput, speedup, efficiency, MFU, time to target.

Definitions (X = global images/s, x = images/s per GPU, both from the run's steady-state window,
summary.json's images_per_s; scalestudy/train/steady.py):

* a run whose window was not filled (window_filled false) keeps its place in the tables with its
  whole-run rates (whole_run_images_per_s: every epoch, one-off costs included), marked:
  window_filled false, throughput_source "whole run", a note; the scaling table counts such repeats
  (windows_unfilled), the figures draw them hollow, and acceptance gives no verdict from them;
* so is a contended run (runs.csv contended: a foreign process on its GPUs while it measured, with
  the evidence in `contention`; scalestudy.analysis.contention): marked `contended` and noted, the
  tables count such repeats (repeats_contended), the figures draw them apart, acceptance gives no
  verdict from them and the communication model leaves them out; a run whose window held fewer GPU
  monitor samples than analysis.monitor.min_window_samples is marked `monitor_window_short`
  (counted: monitor_windows_short), its GPU health left unjudged; a run whose compiled step should
  have run as CUDA graphs and did not is marked `cuda_graphs_skipped` and noted (scalestudy.analysis.graphs);

* a series is one (mode, parallelism): strong or weak scaling with DDP or FSDP. Each is referenced
  to its own 1-GPU runs; a study of DDP only has one series per mode. The throughput columns keep
  their names (images_per_s, ...) and count the workload's unit (sample_unit: images, tokens, ...);
* speedup S(N) = X(N) / X(1), X(1) the mean over the series' 1-GPU repeats (so the intervals of
  speedup and efficiency carry the spread of the N-GPU repeats, not that of the reference);
* strong scaling (fixed global batch, so the same work per epoch): E_s(N) = T(1) / (N T(N)) with T
  the time per epoch = X(N) / (N X(1)) = S(N) / N;
* weak scaling (fixed per-GPU batch): E_w(N) = T(1) / T(N) with T the time per step at that fixed
  per-GPU work = x(N) / x(1) = S(N) / N as well. Throughput is used rather than epoch_time_s so that
  capped epochs (max_steps_per_epoch) and the shrinking weak-scaling epoch compare like for like;
* MFU = x * training FLOPs per sample / the device's peak FLOP/s at the run's precision
  (scalestudy.analysis.mfu: the workload's closed form where its spec has one, else what its trainer
  counted; only against a peak known for the device or configured; else empty, with `mfu_note`
  saying why);
* memory per rank: the median over repeats of peak_memory_bytes (max over ranks; CUDA's peak
  allocation, or the CPU's peak RSS: peak_memory_source) and model_state_bytes_per_rank;
* repeat statistics: mean, sample std and a Student-t interval at analysis.confidence; one repeat
  gives NaN for std and the interval (never a fake zero);
* energy (scalestudy.analysis.energy): joules per sample in the window and over the whole run,
  energy and GPU-hours to the target, the window's mean power (all of a point's GPUs), with their
  repeat statistics, and `energy_source` (the repeats' sources: counter, power integral or "not
  measured: <why>"), appended after the memory columns.

    python -m scalestudy.analysis.metrics --runs results/tables/runs.csv \
        --scaling-out results/tables/scaling.csv --sensitivity-out results/tables/sensitivity.csv \
        [--axes precision per_gpu_batch bucket_cap_mb] [--analysis-json JSON | --config config/config.yaml]
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import pandas as pd

from scalestudy import atomic
from scalestudy.analysis import above_ideal, cli, contention, energy, graphs, mfu
from scalestudy.analysis.stats import repeat_stats
from scalestudy.analysis.tableio import read_csv, require_columns
from scalestudy.plan import grid, runconfig, schema, workloads

log = logging.getLogger("scalestudy.analysis.metrics")

RUN_COLUMNS = (
    "stage",
    "point",
    "world_size",
    "per_gpu_batch",
    "global_batch",
    "images_per_s",
    "images_per_s_per_gpu",
    "epoch_time_s",
    "config.precision",
)
# Per-run quantities summarised over repeats in the scaling table.
STAT_COLUMNS = (
    "images_per_s",
    "images_per_s_per_gpu",
    "epoch_time_s",
    "time_per_step_s",
    "speedup",
    "efficiency",
    "mfu",
    "final_test_acc",
    "time_to_target_s",
    "images_per_s_cv",
)
# Filled with NaN where the catalog lacks them (synthetic studies, runs before the window existed).
OPTIONAL_RUN_COLUMNS = (
    "device_name",
    "device",
    "config.mode",
    "final_test_acc",
    "time_to_target_s",
    "images_per_s_cv",
    "measured_steps",
    "whole_run_images_per_s",
    "whole_run_images_per_s_per_gpu",
    "peak_memory_bytes",
    "model_state_bytes_per_rank",
    "peak_memory_source",
)
# What older catalogs (before workloads) lack: the ResNet-18 DDP study's values.
SERIES_DEFAULTS = {
    "parallelism": grid.DEFAULT_PARALLELISM,
    "sample_unit": workloads.get(workloads.DEFAULT).sample_unit,
    "workload": workloads.DEFAULT,
}
SERIES = ("config.mode", "parallelism")
WINDOW_SOURCE, WHOLE_RUN_SOURCE = "window", "whole run"
UNFILLED_NOTE = "window not filled: whole-run throughput (one-off costs included)"
CONTENDED_NOTE = "contended: GPU shared with a foreign process while measuring"
SHORT_NOTE = "fewer GPU monitor samples in the window than analysis.monitor.min_window_samples"


NODES_COLUMN = "provenance.slurm.job_num_nodes"


def run_nodes(runs: pd.DataFrame, gpus_per_node: int) -> pd.Series:
    """Nodes of each run: Slurm's count where the run had one, else ceil(world / gpus_per_node)."""
    derived = (runs["world_size"] + gpus_per_node - 1) // gpus_per_node
    if NODES_COLUMN not in runs:
        return derived
    return pd.to_numeric(runs[NODES_COLUMN], errors="coerce").fillna(derived).astype(int)


def run_metrics(runs: pd.DataFrame, settings: dict, where: str = "runs") -> pd.DataFrame:
    """Per-run derived columns: nodes, time per step, MFU and (scaling runs) speedup and efficiency."""
    require_columns(runs, RUN_COLUMNS, where)
    runs = runs.copy()
    runs["nodes"] = run_nodes(runs, settings["comm_model"]["gpus_per_node"])
    for column in OPTIONAL_RUN_COLUMNS:
        if column not in runs:
            runs[column] = math.nan
    for column, default in SERIES_DEFAULTS.items():
        runs[column] = runs[column].fillna(default) if column in runs else default
    runs = steady_or_whole_run(runs)
    runs = mark_contention(runs, settings["monitor"]["min_window_samples"])
    runs = graphs.mark(runs)  # a compiled step that should have run as CUDA graphs and did not
    runs["time_per_step_s"] = time_per_step(runs)
    runs["precision"] = effective_precision(runs)
    runs["mfu"], runs["mfu_note"] = mfu.of_runs(runs, settings)  # empty where no peak is known, and why
    return _add_speedup(runs)


def time_per_step(runs: pd.DataFrame) -> pd.Series:
    """Per-GPU batch / per-GPU rate where the rate counts samples (images); where it counts another
    unit (an LM's tokens: a sample is a sequence) the trainer's own step time (the window's, else the
    whole run's where the window was not filled)."""
    per_step = runs["per_gpu_batch"] / runs["images_per_s_per_gpu"]
    counted = runs["sample_unit"] != "images"
    if not counted.any():
        return per_step
    own = pd.Series(math.nan, index=runs.index)
    for column, rows in (
        ("step_time_s", runs["window_filled"]),
        ("whole_run_step_time_s", ~runs["window_filled"]),
    ):
        if column in runs:
            own = own.where(~rows, pd.to_numeric(runs[column], errors="coerce"))
    return per_step.where(~counted, own)


def window_filled(runs: pd.DataFrame) -> pd.Series:
    """True where the run filled its measurement window; a run recorded before windows existed
    (no window_filled) counts as filled."""
    if "window_filled" not in runs:
        return pd.Series(True, index=runs.index)
    recorded = runs["window_filled"].map({True: True, False: False, "True": True, "False": False})
    return recorded.fillna(True).astype(bool)


def steady_or_whole_run(runs: pd.DataFrame) -> pd.DataFrame:
    """The window's rates; the whole-run rates where the window was not filled, marked."""
    runs = runs.copy()
    runs["window_filled"] = window_filled(runs)
    unfilled = ~runs["window_filled"]
    for column in ("images_per_s", "images_per_s_per_gpu"):
        runs[column] = runs[column].astype(float).where(~unfilled, runs[f"whole_run_{column}"])
    runs["throughput_source"] = WINDOW_SOURCE
    runs.loc[unfilled, "throughput_source"] = WHOLE_RUN_SOURCE
    runs["note"] = ""
    runs.loc[unfilled, "note"] = UNFILLED_NOTE
    for _, r in runs[unfilled].iterrows():
        log.warning("%s/%s: %s", r["stage"], r["point"], UNFILLED_NOTE)
    return runs


def mark_contention(runs: pd.DataFrame, min_samples: int) -> pd.DataFrame:
    """contended (with its evidence) and monitor_window_short as booleans, each noted."""
    runs = runs.copy()
    runs["contended"] = contention.contended(runs)
    evidence = runs["contention"] if "contention" in runs else pd.Series("", index=runs.index)
    text = evidence.map(lambda value: "" if pd.isna(value) else str(value))  # all-empty reads as float
    runs["contention"] = text.where(runs["contended"], "")
    if "monitor_window_samples" not in runs:
        runs["monitor_window_samples"] = math.nan
    runs["monitor_window_short"] = contention.window_short(runs, min_samples)
    shared = runs["contended"]
    runs.loc[shared, "note"] = _joined(
        runs.loc[shared, "note"], CONTENDED_NOTE + " (" + runs["contention"] + ")"
    )
    short = runs["monitor_window_short"]
    runs.loc[short, "note"] = _joined(runs.loc[short, "note"], SHORT_NOTE)
    for _, r in runs[shared].iterrows():
        log.warning("%s/%s: %s: %s", r["stage"], r["point"], CONTENDED_NOTE, r["contention"])
    return runs


def _joined(notes: pd.Series, more) -> pd.Series:
    return (notes.fillna("").astype(str) + "; " + more).str.removeprefix("; ")


def _add_speedup(runs: pd.DataFrame) -> pd.DataFrame:
    """Speedup and efficiency of the scaling runs against the mean of their series' 1-GPU runs."""
    runs["speedup"] = math.nan
    runs["efficiency"] = math.nan
    for (mode, parallelism), group in runs[runs["stage"] == "scaling"].groupby(list(SERIES)):
        reference = group.loc[group["world_size"] == 1, "images_per_s"].mean()
        if not reference > 0:
            log.warning("scaling %s (%s) has no 1-GPU run: no speedup or efficiency", mode, parallelism)
            continue
        runs.loc[group.index, "speedup"] = group["images_per_s"] / reference
        runs.loc[group.index, "efficiency"] = runs.loc[group.index, "speedup"] / group["world_size"]
    return runs


def effective_precision(runs: pd.DataFrame) -> pd.Series:
    """The precision a run trained in: the trainer's precision_effective (it falls back to fp32 where
    the device cannot autocast), else the configured one."""
    configured = runs["config.precision"]
    if "precision_effective" not in runs:
        return configured
    return runs["precision_effective"].where(runs["precision_effective"].notna(), configured)


def scaling_table(runs: pd.DataFrame, settings: dict) -> pd.DataFrame:
    """One row per (mode, parallelism, world size): repeat statistics of every per-run metric, then
    the series, the unit and the memory per rank (medians over repeats)."""
    scaling = runs[runs["stage"] == "scaling"]
    rows = []
    for (mode, parallelism, world), group in scaling.groupby([*SERIES, "world_size"], sort=True):
        row = {
            "mode": mode,
            "world_size": int(world),
            "nodes": _first(group, "nodes"),
            "per_gpu_batch": _first(group, "per_gpu_batch"),
            "global_batch": _first(group, "global_batch"),
            "precision": _first(group, "precision"),
            "repeats": len(group),
            "target_reached": int(group["time_to_target_s"].notna().sum()),
            "measured_steps": _first(group, "measured_steps"),
            **_window_marks(group),
        }
        for column in STAT_COLUMNS:
            stats = repeat_stats(group[column], settings["confidence"])
            row.update({f"{column}_{key}": value for key, value in stats.items() if key != "n"})
        row.update(_series_and_memory(group, parallelism))
        row.update(energy.scaling_columns(group, settings["confidence"]))
        row["mfu_note"] = _first(group, "mfu_note")  # why mfu_mean is empty (no peak known), else ''
        rows.append(row)
    return above_ideal.mark(pd.DataFrame(rows))  # efficiency above 100 %: flagged and noted


def _series_and_memory(group: pd.DataFrame, parallelism: str) -> dict:
    """The columns a workload other than the ResNet (or FSDP) needs; appended after the others."""
    return {
        "parallelism": parallelism,
        "sample_unit": _first(group, "sample_unit"),
        "peak_memory_bytes": pd.to_numeric(group["peak_memory_bytes"], errors="coerce").median(),
        "model_state_bytes_per_rank": pd.to_numeric(
            group["model_state_bytes_per_rank"], errors="coerce"
        ).median(),
        "peak_memory_source": _first(group, "peak_memory_source"),
    }


def _window_marks(group: pd.DataFrame) -> dict:
    """window_filled (every repeat filled its window), contended (some repeat was) and
    monitor_window_short (some repeat's window was), how many repeats, and notes saying so."""
    unfilled = int((~group["window_filled"]).sum())
    shared = group[group["contended"]]
    short = int(group["monitor_window_short"].sum())
    no_graphs = int(group[graphs.COLUMN].sum())
    counts = (
        (unfilled, UNFILLED_NOTE),
        (len(shared), CONTENDED_NOTE),
        (short, SHORT_NOTE),
        (no_graphs, graphs.NOTE),
    )
    notes = [f"{n} of {len(group)} repeat(s): {text}" for n, text in counts if n]
    samples = pd.to_numeric(group["monitor_window_samples"], errors="coerce").min()
    return {
        "window_filled": unfilled == 0,
        "windows_unfilled": unfilled,
        "contended": not shared.empty,
        "repeats_contended": len(shared),
        "contention": "; ".join(f"{r['point']}: {r['contention']}" for _, r in shared.iterrows()),
        "monitor_window_samples": samples,
        "monitor_window_short": short > 0,
        "monitor_windows_short": short,
        graphs.COLUMN: no_graphs > 0,
        "repeats_graphs_skipped": no_graphs,
        "note": "; ".join(notes),
    }


def _first(group: pd.DataFrame, column: str):
    return group[column].iloc[0] if column in group else math.nan


SENSITIVITY_COLUMNS = {
    "config.precision": "precision",
    "precision": "precision_effective",
    "per_gpu_batch": "per_gpu_batch",
    "config.bucket_cap_mb": "bucket_cap_mb",
    "world_size": "world_size",
    "global_batch": "global_batch",
    "images_per_s": "images_per_s",
    "images_per_s_per_gpu": "images_per_s_per_gpu",
    "time_per_step_s": "time_per_step_s",
    "epoch_time_s": "epoch_time_s",
    "mfu": "mfu",
    "mfu_note": "mfu_note",  # why mfu is empty (no peak known for the device), else ''
    "final_test_acc": "final_test_acc",
    "measured_steps": "measured_steps",
    "images_per_s_cv": "images_per_s_cv",
    "window_filled": "window_filled",
    "contended": "contended",
    "contention": "contention",
    "monitor_window_samples": "monitor_window_samples",
    "monitor_window_short": "monitor_window_short",
    graphs.COLUMN: graphs.COLUMN,
    "throughput_source": "throughput_source",
    "note": "note",
}


DEFAULT_AXES = tuple(schema.node("sensitivity", "axes")["default"])  # the default sweep's keys, in order
PRECISION_ORDER = tuple(schema.definition("precision")["enum"])  # fp32, tf32, fp16, bf16: figures, tables


def _axis_values(sweep: pd.DataFrame, key: str) -> pd.Series:
    """The sweep's config.<key> values, the trainer's default where the run config leaves it out."""
    default = runconfig.DEFAULTS.get(key)
    values = sweep.get(f"config.{key}", pd.Series(default, index=sweep.index, dtype=object))
    return values if default is None else values.fillna(default)


def sensitivity_table(runs: pd.DataFrame, axes: Sequence[str] = DEFAULT_AXES) -> pd.DataFrame:
    """One row per sweep point, with its per-GPU throughput gain over the 1-GPU baseline.

    `axes` are the run-config keys the sweep varies (config sensitivity.axes, order kept): each is a
    column (its config.<key> value), and the rows are sorted by them. The columns of the default axes
    are those of SENSITIVITY_COLUMNS; further axes follow the gain and best columns, sample_unit
    comes last."""
    sweep = runs[runs["stage"] == "sensitivity"]
    # the grid leaves a value at the trainer's default out of the run config (runconfig.DEFAULTS)
    omitted_at_default = {key for key in axes if key in runconfig.DEFAULTS}
    require_columns(
        sweep,
        [f"config.{key}" for key in axes if key != "per_gpu_batch" and key not in omitted_at_default],
        "sensitivity runs",
    )
    present = {source: name for source, name in SENSITIVITY_COLUMNS.items() if source in sweep}
    table = sweep[list(present)].rename(columns=present)
    for name in SENSITIVITY_COLUMNS.values():
        if name not in table:
            table[name] = math.nan
    table = table[list(SENSITIVITY_COLUMNS.values())]
    baselines = runs[runs["stage"] == "baseline"]
    baseline = baselines["images_per_s_per_gpu"].mean()
    table["baseline_images_per_s_per_gpu"] = baseline
    table["baseline_window_filled"] = bool(baselines["window_filled"].all())
    table["baseline_contended"] = bool(contention.contended(baselines).any())
    table["gain_vs_baseline"] = table["images_per_s_per_gpu"] / baseline - 1.0
    usable = table["window_filled"] & ~contention.contended(table)  # filled, unshared windows first
    judged = table[usable] if usable.any() else table
    table["best"] = table["images_per_s_per_gpu"] == judged["images_per_s_per_gpu"].max()
    for key in axes:
        if key not in table:
            table[key] = _axis_values(sweep, key)
    table["sample_unit"] = sweep["sample_unit"]
    return table.sort_values(list(axes), kind="stable").reset_index(drop=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = cli.parser(__doc__.splitlines()[0])
    parser.add_argument("--runs", required=True, help="The run catalog (runs.csv).")
    parser.add_argument("--scaling-out", required=True, help="Scaling table CSV to write.")
    parser.add_argument("--sensitivity-out", required=True, help="Sensitivity table CSV to write.")
    parser.add_argument(
        "--axes",
        nargs="+",
        default=list(DEFAULT_AXES),
        help="The sensitivity sweep's run-config keys (sensitivity.axes), in order.",
    )
    args = parser.parse_args(argv)
    settings = cli.start(args)
    runs = run_metrics(read_csv(args.runs), settings, args.runs)
    scaling = scaling_table(runs, settings)
    sensitivity = sensitivity_table(runs, args.axes)
    atomic.write_csv(args.scaling_out, scaling)
    atomic.write_csv(args.sensitivity_out, sensitivity)
    log.info(
        "scaling: %d rows -> %s; sensitivity: %d rows -> %s",
        len(scaling),
        args.scaling_out,
        len(sensitivity),
        args.sensitivity_out,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
