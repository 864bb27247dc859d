"""The macros of the closing sections: the communication model (fitted, and benchmarked), the
resource estimate and the threats to validity, contended runs named among them (scalestudy.paper.numbers
calls every writer in SECTIONS, after those of scalestudy.paper.sections and scalestudy.paper.results)."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from scalestudy.analysis import contention as shared_gpus
from scalestudy.analysis import graphs
from scalestudy.paper.macros import NOT_MEASURED, Numbers
from scalestudy.paper.sections import (
    Data,
    ddp_rows,
    distinct,
    first_value,
    formatted,
    is_missing,
    join,
)
from scalestudy.paper.tables import GRAPHS_SKIPPED_MARK, escape, integer, number, percent

COMM_FIT = {
    "CommFitMethod": ("method", lambda v, u: escape(v)),
    "CommFitPoints": ("points", lambda v, u: integer(float(v))),
    "CommFitDof": ("degrees_of_freedom", lambda v, u: integer(float(v))),
    "CommAlpha": ("alpha_eff", lambda v, u: f"{number(3)(float(v))}~{_unit(u)}"),
    "CommBandwidth": (
        "bandwidth_eff",
        lambda v, u: (r"$\infty$" if float(v) == math.inf else number(3)(float(v))) + f"~{_unit(u)}",
    ),
    "CommResidual": ("rms_residual", lambda v, u: f"{number(3)(float(v))}~{_unit(u)}"),
    "CommOverlap": ("overlap_fraction", lambda v, u: percent()(float(v))),
}


def _unit(unit: Any) -> str:
    return {"us": r"$\mu$s"}.get(str(unit), escape(unit)) if not is_missing(unit) else ""


def _quantities(table: pd.DataFrame | None) -> dict[str, tuple[Any, Any]]:
    if table is None or "quantity" not in table:
        return {}
    return {str(r["quantity"]): (r["value"], r.get("unit")) for _, r in table.iterrows()}


def comm_model(numbers: Numbers, data: Data) -> None:
    fit = _quantities(data.table("comm_fit"))
    for macro, (quantity, formatter) in COMM_FIT.items():
        value, unit = fit.get(quantity, (None, None))
        numbers.add(
            macro,
            NOT_MEASURED if is_missing(value) else formatter(value, unit),
            f"comm_model_fit.csv quantity={quantity}",
        )
    prediction = data.table("comm_prediction")
    for mode in ("strong", "weak"):
        Mode = mode.capitalize()
        rows = prediction[prediction["mode"] == mode] if prediction is not None else pd.DataFrame()
        if rows.empty:
            for name in ("ExtrapolationWorld", "PredictedEffFit", "PredictedEffByNetwork"):
                numbers.add(f"{Mode}{name}", NOT_MEASURED, f"comm_model_prediction.csv: no {mode} rows")
            continue
        world = int(rows["world_size"].max())
        at_world = rows[rows["world_size"] == world]
        source = f"comm_model_prediction.csv mode={mode} world_size={world}"
        numbers.add(f"{Mode}ExtrapolationWorld", str(world), source)
        fitted = at_world[at_world["curve"].astype(str).str.startswith("fit")]
        numbers.add(
            f"{Mode}PredictedEffFit",
            formatted(first_value(fitted, "efficiency"), percent()),
            source + " curve=fit",
        )
        others = [
            f"{escape(r['curve'])}: {percent()(r['efficiency'])}"
            for _, r in at_world.iterrows()
            if not str(r["curve"]).startswith("fit")
        ]
        numbers.add(
            f"{Mode}PredictedEffByNetwork",
            join(others) if others else NOT_MEASURED,
            source + " network curves",
        )
    _bench(numbers, data)


def _bench(numbers: Numbers, data: Data) -> None:
    """The measured all-reduce's alpha and bandwidth (comm_bench_fit.csv, scalestudy.preflight.collectives)
    at the
    largest world size benchmarked."""
    bench = data.table("comm_bench_fit")
    rows = bench[bench["collective"] == "all_reduce"] if bench is not None and "collective" in bench else None
    rows = (
        rows.dropna(subset=["alpha_s", "bandwidth_gb_s"]) if rows is not None and "alpha_s" in rows else None
    )
    if rows is None or rows.empty:
        why = "not given" if bench is None else "has no fitted all_reduce row"
        for macro in ("BenchAlpha", "BenchBandwidth", "BenchWorld", "BenchPlacement"):
            numbers.add(macro, NOT_MEASURED, f"comm_bench_fit.csv {why}")
        numbers.add("BenchSummary", "The collective benchmark was not measured.", f"comm_bench_fit.csv {why}")
        return
    row = rows.sort_values("world_size").iloc[-1]
    world = int(row["world_size"])
    source = f"comm_bench_fit.csv collective=all_reduce world_size={world} placement={row.get('placement')}"
    numbers.add("BenchAlpha", f"{number(3)(float(row['alpha_s']) * 1e6)}~$\\mu$s", source + " alpha_s")
    numbers.add(
        "BenchBandwidth", f"{number(3)(float(row['bandwidth_gb_s']))}~GB/s", source + " bandwidth_gb_s"
    )
    numbers.add("BenchWorld", integer(row["world_size"]), source)
    numbers.add("BenchPlacement", escape(row.get("placement", NOT_MEASURED)), source)
    numbers.add(
        "BenchSummary",
        f"The collective benchmark measured, for all-reduce at {world} {data.units}"
        f" ({escape(row.get('placement'))}),"
        f" a latency of {numbers.macros['BenchAlpha'].value} and a bus bandwidth of"
        f" {numbers.macros['BenchBandwidth'].value}.",
        source,
    )


def resources(numbers: Numbers, data: Data) -> None:
    table = data.table("resources")
    hours = data.unit.replace(" ", "-") + "-hours"
    whole = table[table["what"] == "whole grid"] if table is not None else None
    row = whole.iloc[0] if whole is not None and len(whole) else None
    for macro, column, formatter in (
        ("GridRuns", "runs", integer),
        ("GridWallHours", "wall_hours", lambda v: number(3)(v) + "~h"),
        ("GridUnitHours", "gpu_hours", lambda v: number(3)(v) + "~" + hours),
        ("GridRequestHours", "requested_gpu_hours", lambda v: number(3)(v) + "~" + hours),
    ):
        numbers.add(
            macro,
            NOT_MEASURED if row is None else formatted(row[column], formatter),
            f"resource_estimate.csv what='whole grid' {column}",
        )
    for scope, prefix in (("full training", "Full"), ("model", "Model")):
        rows = (
            table[(table["scope"] == scope) & (table["mode"] == "strong") & ddp_rows(table)]
            if table is not None
            else pd.DataFrame()
        )
        if rows.empty:
            for name in ("World", "Epochs", "UnitHours", "WallHours"):
                numbers.add(f"{prefix}{name}", NOT_MEASURED, f"resource_estimate.csv: no {scope} strong rows")
            continue
        largest = rows.sort_values("world_size").iloc[-1]
        world = int(largest["world_size"])
        source = f"resource_estimate.csv scope='{scope}' mode=strong world_size={world} ({largest['source']})"
        numbers.add(f"{prefix}World", integer(largest["world_size"]), source)
        numbers.add(f"{prefix}Epochs", integer(largest["epochs"]), source)
        numbers.add(f"{prefix}UnitHours", number(3)(largest["gpu_hours"]) + "~" + hours, source)
        numbers.add(f"{prefix}WallHours", number(3)(largest["wall_hours"]) + "~h", source)


def threats(numbers: Numbers, data: Data) -> None:
    runs = data.table("runs")
    dirty = distinct(runs, "provenance.git_dirty")
    commits = distinct(runs, "provenance.git_commit")
    tree = "" if not dirty else (" with uncommitted changes" if "True" in dirty else " from a clean tree")
    numbers.add(
        "CodeVersion",
        f"commit {escape(', '.join(c[:12] for c in commits))}{tree}" if commits else "a commit no run named",
        "runs.csv provenance.git_commit, provenance.git_dirty",
    )
    numbers.add("RunCount", str(len(runs)) if runs is not None else NOT_MEASURED, "runs.csv rows")
    # profile runs stop after their profiled steps: they have no window to fill
    measured = runs[runs["stage"] != "profile"] if runs is not None and "stage" in runs else runs
    window = measured["window_filled"] if measured is not None and "window_filled" in measured else None
    numbers.add(
        "WindowFilled",
        NOT_MEASURED
        if window is None
        else f"{int(window.astype(str).str.lower().eq('true').sum())} of {len(window)}",
        "runs.csv stage != profile: window_filled" + ("" if window is not None else " (column absent)"),
    )
    active = next((c for c in (runs.columns if runs is not None else []) if "sm_active_pct" in c), None)
    numbers.add(
        "SmActive",
        NOT_MEASURED
        if active is None or runs[active].dropna().empty
        else f"{number(3)(runs[active].mean())}\\,\\%",
        f"runs.csv {active or 'sm_active_pct (column absent)'} (mean over runs)",
    )


def contention(numbers: Numbers, data: Data) -> None:
    """The runs whose GPUs were shared while they measured, by name with the evidence; how many were
    checked (NVML listed their GPUs' processes); windows with fewer GPU monitor samples than the
    floor; host load above the job's CPUs (runs.csv: scalestudy.analysis.contention)."""
    runs = data.table("runs")
    if runs is None or "contended" not in runs:
        why = "runs.csv not given" if runs is None else "runs.csv has no contended column"
        for macro in ("ContendedRuns", "ContendedPoints", "ContentionChecked", "MonitorWindowShort"):
            numbers.add(macro, NOT_MEASURED, why)
        numbers.add("HostLoadWarnings", NOT_MEASURED, why)
        numbers.add("MonitorWindowFloor", str(data.context["min_window_samples"]), "analysis.monitor")
        return
    shared = runs[shared_gpus.contended(runs)]
    names = [
        f"{r['stage']}/{r['point']} ({r.get('contention') or 'contended'})" for _, r in shared.iterrows()
    ]
    numbers.add("ContendedRuns", f"{len(shared)} of {len(runs)}", "runs.csv contended")
    numbers.add(
        "ContendedPoints", escape("; ".join(names)) if names else "none", "runs.csv contended, contention"
    )
    checked = shared_gpus.flags(runs, "contention_checked")
    numbers.add("ContentionChecked", f"{int(checked.sum())} of {len(runs)}", "runs.csv contention_checked")
    floor = int(data.context["min_window_samples"])
    numbers.add("MonitorWindowFloor", str(floor), "analysis.monitor.min_window_samples")
    samples = runs.get("monitor_window_samples", pd.Series(float("nan"), index=runs.index))
    sampled = pd.to_numeric(samples, errors="coerce").notna()
    short = shared_gpus.window_short(runs, floor)
    numbers.add(
        "MonitorWindowShort",
        f"{int(short.sum())} of {int(sampled.sum())}",
        f"runs.csv monitor_window_samples < {floor} (of the runs with GPU samples)",
    )
    warnings = runs.get("host_load_warning", pd.Series(dtype=object))
    warned = warnings.map(lambda text: not pd.isna(text) and str(text) != "")
    numbers.add("HostLoadWarnings", str(int(warned.sum())), "runs.csv host_load_warning not empty")


def cuda_graphs(numbers: Numbers, data: Data) -> None:
    """The threats' item on CUDA graphs, where some run's compiled step should have replayed them:
    how many did, and by name the points Inductor skipped them in (runs.csv cuda_graphs.*,
    scalestudy.analysis.graphs): those measured a slower step than the compiled one. Empty (no
    item) where no run asked for graphs: eager, or on the CPU."""
    runs = data.table("runs")
    asked = graphs.expected(runs) if runs is not None else pd.Series(dtype=bool)
    if not asked.any():
        numbers.add("CudaGraphsItem", "", "runs.csv cuda_graphs.expected: no run asked for CUDA graphs")
        return
    lost = runs[asked & graphs.skipped(runs)]
    text = (
        r"\item \emph{CUDA graphs.} Runs whose compiled step was to replay CUDA graphs: "
        f"{int(asked.sum())} of {len(runs)}; "
    )
    if lost.empty:
        text += "each of them ran its graphs."
    else:
        names = "; ".join(f"{r['stage']}/{r['point']}" for _, r in lost.iterrows())
        reasons = sorted(
            {str(r) for r in lost.get(graphs.REASONS, pd.Series(dtype=object)).dropna() if str(r)}
        )
        text += (
            f"Inductor skipped the graphs of {len(lost)} ({escape(names)}"
            + (f"; Inductor's reason: {escape('; '.join(reasons))}" if reasons else "")
            + f"): they measured a slower step than the compiled one and are marked {GRAPHS_SKIPPED_MARK} "
            "in the tables."
        )
    numbers.add("CudaGraphsItem", text, "runs.csv cuda_graphs.expected, cuda_graphs.skipped, skip_reasons")


SECTIONS = (
    comm_model,
    resources,
    threats,
    contention,
    cuda_graphs,
)
