"""The macros of the results sections: scaling (with memory), acceptance, profiling and sensitivity
(see scalestudy.paper.sections; the closing sections: scalestudy.paper.discussion)."""

from __future__ import annotations

import pandas as pd

from scalestudy.analysis import above_ideal
from scalestudy.analysis.series import parallelism_of
from scalestudy.paper.macros import NOT_MEASURED, Numbers, spell
from scalestudy.paper.sections import (
    Data,
    ddp_rows,
    distinct,
    first_value,
    formatted,
    is_missing,
    join,
    seconds,
)
from scalestudy.paper.tables import escape, fixed, integer, measured, number, percent, prose, relation


def scaling(numbers: Numbers, data: Data) -> None:
    """The per-point macros of the DDP series (the study's reference; FSDP rows are in the table and
    the memory sentence)."""
    table = data.table("scaling")
    if table is not None:
        table = table[ddp_rows(table)]
    memory(numbers, data)
    for mode in ("strong", "weak"):
        Mode = mode.capitalize()
        rows = table[table["mode"] == mode].sort_values("world_size") if table is not None else pd.DataFrame()
        if rows.empty:
            numbers.add(f"{Mode}LargestWorld", NOT_MEASURED, f"scaling.csv: no {mode} rows")
            for name in _POINT_MACROS:
                for at in ("Largest", "Reference"):
                    numbers.add(f"{Mode}{name}At{at}", NOT_MEASURED, f"scaling.csv: no {mode} rows")
            continue
        points = [(spell(int(row["world_size"])), row, "") for _, row in rows.iterrows()]
        points += [("Largest", rows.iloc[-1], " (largest)"), ("Reference", rows.iloc[0], " (reference)")]
        for at, row, role in points:
            world = int(row["world_size"])
            runs = data.run_ids("scaling", **{"config.mode": mode, "world_size": world})
            source = f"scaling.csv mode={mode} world_size={world}{role}; {runs}"
            if at == "Largest":
                numbers.add(f"{Mode}LargestWorld", str(world), source)
            only = data.unit if at == "Largest" and world == 1 else ""  # a one-GPU study: nothing scaled
            _scaling_point(numbers, Mode, at, row, source, data.per_s, only)


_POINT_MACROS = ("Eff", "EffInterval", "Speedup", "Throughput", "StepTime", "Nodes")


def _scaling_point(
    numbers: Numbers, Mode: str, at: str, row: pd.Series, source: str, per_s: str, only: str = ""
) -> None:
    numbers.add(f"{Mode}EffAt{at}", efficiency_words(row, only), source + "; efficiency_mean")
    low, high = row.get("efficiency_ci_low"), row.get("efficiency_ci_high")
    interval = (
        f"no interval ({int(row['repeats'])} repeat)"
        if is_missing(low) or is_missing(high)
        else f"[{percent()(low)}, {percent()(high)}]"
    )
    numbers.add(f"{Mode}EffIntervalAt{at}", interval, source + "; efficiency_ci_low/high")
    numbers.add(f"{Mode}SpeedupAt{at}", formatted(row["speedup_mean"], fixed(2)), source + "; speedup_mean")
    numbers.add(
        f"{Mode}ThroughputAt{at}",
        formatted(row["images_per_s_mean"], number(4), per_s),
        source + "; images_per_s_mean",
    )
    numbers.add(
        f"{Mode}StepTimeAt{at}", seconds(row["time_per_step_s_mean"]), source + "; time_per_step_s_mean"
    )
    numbers.add(f"{Mode}NodesAt{at}", formatted(row.get("nodes"), integer), source + "; nodes")


def efficiency_words(row: pd.Series, only: str = "") -> str:
    """A point's efficiency; above 100 % with the words that it is to be checked
    (scalestudy.analysis.above_ideal); `only` (GPU): the study's only size, so the reference itself."""
    value = formatted(row["efficiency_mean"], percent())
    if above_ideal.row_flagged(row):
        return f"{value} ({prose(above_ideal.BRIEFLY)})"
    if only:
        return f"{value} (one {only} only: the reference itself, nothing scaled)"
    return value


MIB = 1 << 20
PEAK_SOURCES = {
    "cuda_max_memory_allocated": "peak allocated CUDA memory",
    "cpu_peak_rss": "peak resident memory",
}


def memory(numbers: Numbers, data: Data) -> None:
    """One sentence on the memory per rank at the largest strong-scaling size, per parallelism."""
    table = data.table("scaling")
    columns = {"peak_memory_bytes", "model_state_bytes_per_rank"}
    rows = table[table["mode"] == "strong"] if table is not None and columns <= set(table) else None
    if rows is None or rows[list(columns)].dropna(how="all").empty:
        numbers.add(
            "MemorySummary", "Memory per rank was not recorded by these runs.", "scaling.csv: no memory"
        )
        return
    world = int(rows["world_size"].max())
    at = rows[rows["world_size"] == world].copy()
    at["parallelism"] = parallelism_of(at)
    parts = []
    for _, row in at.sort_values("parallelism").iterrows():
        state = formatted(row["model_state_bytes_per_rank"], lambda v: number(3)(v / MIB) + "~MiB")
        peak = formatted(row["peak_memory_bytes"], lambda v: number(3)(v / MIB) + "~MiB")
        parts.append(
            f"with {escape(str(row['parallelism']).upper())} {state} of model state and {peak} at peak"
        )
    what = PEAK_SOURCES.get(str(first_value(at, "peak_memory_source")), "peak memory")
    numbers.add(
        "MemorySummary",
        f"In strong scaling at {world} {data.unit if world == 1 else data.units}, one rank holds "
        + join(parts)
        + f" (the peak is the busiest rank's {what}).",
        f"scaling.csv mode=strong world_size={world} model_state_bytes_per_rank, peak_memory_bytes; "
        + data.run_ids("scaling", **{"config.mode": "strong", "world_size": world}),
    )


ACCEPTANCE_ROLES = {
    "Strong": "strong-scaling efficiency at",
    "Weak": "weak-scaling step-time variation over N <=",
    "Gain": "throughput gain",
}


def acceptance(numbers: Numbers, data: Data) -> None:
    table = data.table("acceptance")
    rows = table[table["status"] != "informative"] if table is not None else pd.DataFrame(columns=["status"])
    status = rows["status"].astype(str)
    counts = {
        "Count": len(rows),
        "Passed": int((status == "pass").sum()),
        "Failed": int((status == "fail").sum()),
        "NotMeasured": int(status.str.startswith(NOT_MEASURED).sum()),
    }
    for name, count in counts.items():
        numbers.add(
            f"Acceptance{name}",
            str(count) if table is not None else NOT_MEASURED,
            "acceptance.csv status (criteria, not informative rows)",
        )
    items = [_criterion_sentence(row) for _, row in rows.iterrows()]
    numbers.add(
        "AcceptanceList",
        r"\begin{itemize}" + "".join(rf"\item {item}" for item in items) + r"\end{itemize}"
        if items
        else "no acceptance criteria were evaluated.",
        "acceptance.csv (every criterion; the informative rows are in the table)",
    )
    for role, prefix in ACCEPTANCE_ROLES.items():
        row = next((r for _, r in rows.iterrows() if str(r["criterion"]).startswith(prefix)), None)
        source = f"acceptance.csv criterion '{prefix}...'"
        if row is None:
            numbers.add(f"Accept{role}Verdict", NOT_MEASURED, source + " (absent)")
            numbers.add(f"Accept{role}World", NOT_MEASURED, source + " (absent)")
            continue
        numbers.add(f"Accept{role}Verdict", escape(row["status"]), source + " status")
        numbers.add(f"Accept{role}World", formatted(row["world_size"], integer), source + " world_size")
        if role in ("Strong", "Weak") and not is_missing(row["world_size"]):
            # the acceptance size as a per-point macro (e.g. \StrongEffAtEight) where the grid lacks it
            name = f"{role}EffAt{spell(int(row['world_size']))}"
            numbers.missing(name, source + f" ({row['status']})")


def _criterion_sentence(row: pd.Series) -> str:
    """'<criterion> (target <t>): <measured>, <status>; <note>.'; a criterion without a measured value
    gives its status alone ('not measured (largest N=2)'), never 'not measured, not measured'."""
    note = f"; {relation(row['note'])}" if not is_missing(row.get("note")) and str(row.get("note")) else ""
    criterion, target, status = relation(row["criterion"]), relation(row["target"]), escape(row["status"])
    value = "" if is_missing(row["measured"]) else measured(row["measured"], row["target"]) + ", "
    return f"{criterion} (target {target}): {value}\\emph{{{status}}}{note}."


PROFILE_CATEGORIES = {
    "Compute": ("conv_gemm", "norm_elementwise"),
    "Comm": ("communication",),
    "Data": ("data_loading",),
    "Copy": ("memory_copy",),
    "Idle": ("idle_other",),
}
PROFILE_TOOLS = {"torch": r"torch.profiler (the CPU fallback)", "nsys": r"Nsight Systems~\cite{nsys}"}


def profiling(numbers: Numbers, data: Data) -> None:
    breakdown = data.table("profile_breakdown")
    overlap = data.table("profile_overlap")
    if breakdown is None:
        for name in (
            "ProfileTool",
            "ProfileWorldSizes",
            "ProfileLargestWorld",
            "ProfileStepTimeAtLargest",
            "ProfileOverlapAtLargest",
        ):
            numbers.add(name, NOT_MEASURED, "profile breakdown.csv not given")
        for name in PROFILE_CATEGORIES:
            numbers.add(f"Profile{name}ShareAtLargest", NOT_MEASURED, "profile breakdown.csv not given")
        return
    tools = distinct(breakdown, "tool")
    numbers.add(
        "ProfileTool", join([PROFILE_TOOLS.get(t, escape(t)) for t in tools]), "profile breakdown.csv tool"
    )
    worlds = sorted({int(w) for w in breakdown["world_size"]})
    numbers.add("ProfileWorldSizes", join([str(w) for w in worlds]), "profile breakdown.csv world_size")
    numbers.add("ProfileLargestWorld", str(worlds[-1]), "profile breakdown.csv world_size (largest)")
    for world in worlds:
        rows = breakdown[breakdown["world_size"] == world]
        # per rank, then the mean over ranks (every rank profiles the same window)
        per_rank = rows.groupby("rank")
        source = f"profile breakdown.csv world_size={world} (mean over ranks); " + data.run_ids(
            "profile", world_size=world
        )
        for at in [spell(world)] + (["Largest"] if world == worlds[-1] else []):
            step = per_rank["time_per_step_s"].sum().mean()
            numbers.add(f"ProfileStepTimeAt{at}", seconds(step), source + "; sum of time_per_step_s")
            for name, categories in PROFILE_CATEGORIES.items():
                share = (
                    rows[rows["category"].isin(categories)]
                    .groupby("rank")["fraction"]
                    .sum()
                    .reindex(per_rank.size().index, fill_value=0)
                    .mean()
                )
                numbers.add(
                    f"Profile{name}ShareAt{at}",
                    percent()(share),
                    source + f"; fraction of {'+'.join(categories)}",
                )
            value = None
            if overlap is not None:
                value = overlap[overlap["world_size"] == world]["overlap_fraction"].mean()
            numbers.add(
                f"ProfileOverlapAt{at}",
                "no communication to overlap" if world == 1 else formatted(value, percent()),
                f"profile overlap.csv world_size={world} overlap_fraction",
            )


AXIS_NAMES = {
    "bucket_cap_mb": "the DDP bucket size",
    "per_gpu_batch": "the per-{unit} batch",
    "precision": "the precision",
    "comm_hook": "the DDP communication hook",
    "parallelism": "the parallelism (DDP or FSDP)",
}


def _axis_value(key: str, value) -> str:
    """How one axis value of a point reads: 'bf16', 'batch 128', '25~MB buckets', 'key = value'."""
    if key == "precision":
        return escape(value)
    if key == "per_gpu_batch":
        return f"batch {integer(value)}"
    if key == "bucket_cap_mb":
        return f"{number(3)(value)}~MB buckets"
    return f"{escape(key)} {escape(value if not isinstance(value, float) else number(3)(value))}"


def _axis_column(key: str) -> str:
    """runs.csv's column of a sweep axis (run_ids matches the best point's runs on it)."""
    return key if key == "per_gpu_batch" else f"config.{key}"


def sensitivity(numbers: Numbers, data: Data) -> None:
    table = data.table("sensitivity")
    axes = list(data.context["sensitivity_axes"])
    names = [AXIS_NAMES.get(key, escape(key)).format(unit=data.unit) for key in reversed(axes)]
    listed = ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else names[0]
    numbers.add("SensitivityAxes", listed, "config: sensitivity.axes (last first)")
    macros = (
        "World",
        "Points",
        "BestPoint",
        "BestPrecision",
        "BestBatch",
        "BestBucket",
        "BestThroughput",
        "BestGain",
        "WorstGain",
        "BaselineThroughput",
        "Precision",
    )
    if table is None:
        for name in macros:
            numbers.add(f"Sensitivity{name}", NOT_MEASURED, "sensitivity.csv not given")
        return
    numbers.add(
        "SensitivityWorld", formatted(table["world_size"].iloc[0], integer), "sensitivity.csv world_size"
    )
    numbers.add("SensitivityPoints", str(len(table)), f"sensitivity.csv rows; {data.run_ids('sensitivity')}")
    best_mask = (
        table["best"].astype(str).str.lower() == "true"
        if "best" in table
        else table["images_per_s_per_gpu"] == table["images_per_s_per_gpu"].max()
    )
    best = table[best_mask].iloc[0] if best_mask.any() else table.sort_values("images_per_s_per_gpu").iloc[-1]
    present = [key for key in axes if key in best.index]
    point = " ".join(f"{key}={best[key]}" for key in present)
    runs = data.run_ids("sensitivity", **{_axis_column(key): best[key] for key in present})
    source = f"sensitivity.csv best row {point}; {runs}"
    values = [_axis_value(key, best[key]) for key in present]
    numbers.add(
        "SensitivityBestPoint", values[0] + (" with " + join(values[1:]) if values[1:] else ""), source
    )
    for macro, column, formatter in (
        ("SensitivityBestPrecision", "precision", escape),
        ("SensitivityBestBatch", "per_gpu_batch", integer),
        ("SensitivityBestBucket", "bucket_cap_mb", lambda v: f"{number(3)(v)}~MB"),
    ):
        numbers.add(macro, formatted(best.get(column), formatter), source)
    numbers.add(
        "SensitivityBestThroughput",
        number(4)(best["images_per_s_per_gpu"]) + f"~{data.sample_unit}/s per " + data.unit,
        source,
    )
    numbers.add(
        "SensitivityBestGain", formatted(best["gain_vs_baseline"], percent()), source + "; gain_vs_baseline"
    )
    numbers.add(
        "SensitivityWorstGain",
        formatted(table["gain_vs_baseline"].min(), percent()),
        "sensitivity.csv min gain_vs_baseline",
    )
    numbers.add(
        "SensitivityBaselineThroughput",
        formatted(best.get("baseline_images_per_s_per_gpu"), number(4), data.per_s + " per " + data.unit),
        "sensitivity.csv baseline_images_per_s_per_gpu; " + data.run_ids("baseline"),
    )
    numbers.add("SensitivityPrecision", precision_summary(table, axes, data), "sensitivity.csv by precision")


def precision_summary(table: pd.DataFrame, axes: list[str], data: Data) -> str:
    """Which precision was fastest at each setting of the sweep's other axes, and how much slower each
    other one was ('By precision, at batch 256 tf32 is the fastest (26{,}737~images/s per GPU), bf16
    19.2\\,\\% slower; at batch 512 ...'), or that the sweep did not vary the precision."""
    if "precision" not in axes or table["precision"].nunique() < 2:
        return "The sweep did not vary the precision."
    others = [key for key in axes if key != "precision" and key in table]
    groups = table.groupby(others, sort=True, dropna=False) if others else [((), table)]
    sentences = []
    for values, rows in groups:
        values = values if isinstance(values, tuple) else (values,)
        ranked = rows.sort_values("images_per_s_per_gpu", ascending=False, kind="stable")
        if ranked["precision"].nunique() < 2:
            continue
        winner, fastest = ranked.iloc[0], ranked["images_per_s_per_gpu"].iloc[0]
        where = join([_axis_value(key, value) for key, value in zip(others, values, strict=True)])
        rate = number(4)(fastest) + f"{data.per_s} per {data.unit}"
        slower = [
            f"{escape(r['precision'])} {percent()(1 - r['images_per_s_per_gpu'] / fastest)} slower"
            for _, r in ranked.iloc[1:].iterrows()
        ]
        head = f"at {where} " if where else ""
        sentences.append(f"{head}{escape(winner['precision'])} is the fastest ({rate}), {join(slower)}")
    if not sentences:
        return "The sweep compared no two precisions at the same setting of its other axes."
    return "By precision, " + "; ".join(sentences) + "."


SECTIONS = (
    scaling,
    acceptance,
    profiling,
    sensitivity,
)
