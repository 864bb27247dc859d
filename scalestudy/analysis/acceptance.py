"""The study's acceptance criteria, each with its measured value and pass / fail.

A criterion at a world size the grid does not reach is "not measured (largest N=...)", never a
pass; the same quantity at the largest measured N follows as an "informative" row.

The scaling criteria judge each series (scaling.csv's parallelism, absent = ddp) on its own: a DDP-only
study has one row per criterion as before; with DDP and FSDP each criterion has a row per series,
DDP first, the series named in the criterion ("... (FSDP)"). Rates are in the runs' sample_unit
(images/s per GPU for the ResNet, tokens/s per rank for an LM).

A criterion gets no verdict from a point whose window was not filled (whole-run throughput) or whose
GPUs were shared with a foreign process while it measured (contended: scalestudy.analysis.contention):
its row says "not measured (...)" and why, and how to re-measure. Nor does a point whose efficiency
is above 100 % (scaling.csv's efficiency_above_ideal: a measurement problem or a superlinear gain,
to check: scalestudy.analysis.above_ideal): its row keeps the measured value and says so. The GPU health
rows leave out the GPUs of contended runs and those whose window held fewer than
analysis.monitor.min_window_samples samples.

    python -m scalestudy.analysis.acceptance --scaling results/tables/scaling.csv \
        --sensitivity results/tables/sensitivity.csv --out results/tables/acceptance.csv \
        --html results/tables/acceptance.html [--analysis-json JSON | --config FILE]
"""

from __future__ import annotations

import html
import logging
import math
from collections.abc import Sequence

import pandas as pd

from scalestudy import atomic
from scalestudy.analysis import above_ideal, cli, monitor_window, series
from scalestudy.analysis.contention import contended, flags
from scalestudy.analysis.metrics import window_filled
from scalestudy.analysis.tableio import read_csv, read_json
from scalestudy.plan.runfiles import NOT_MEASURED

log = logging.getLogger("scalestudy.analysis.acceptance")

COLUMNS = ("criterion", "target", "world_size", "measured", "ci_low", "ci_high", "status", "note")
PASS, FAIL, INFORMATIVE = "pass", "fail", "informative"  # and NOT_MEASURED (runfiles)
ABOVE_IDEAL = f"{NOT_MEASURED} (efficiency above 100%)"


def _row(criterion, target, world, measured=math.nan, status=NOT_MEASURED, note="", ci=(math.nan, math.nan)):
    return dict(zip(COLUMNS, (criterion, target, world, measured, ci[0], ci[1], status, note), strict=True))


def _verdict(ok: bool, informative: bool) -> str:
    if informative:
        return INFORMATIVE
    return PASS if ok else FAIL


def _mode(scaling: pd.DataFrame, mode: str) -> pd.DataFrame:
    return (
        scaling[scaling["mode"] == mode].sort_values("world_size", kind="stable") if len(scaling) else scaling
    )


def scaling_criteria(scaling: pd.DataFrame, criteria: dict) -> list[dict]:
    """Strong efficiency then weak variation, each for every series."""
    parts = series.by_parallelism(scaling)
    strong_min, strong_world = criteria["strong_efficiency_min"], criteria["strong_efficiency_world"]
    weak_max, weak_world = criteria["weak_variation_max"], criteria["weak_variation_world"]
    return [
        *(row for label, rows in parts for row in strong_efficiency(rows, strong_min, strong_world, label)),
        *(row for label, rows in parts for row in weak_variation(rows, weak_max, weak_world, label)),
    ]


def strong_efficiency(scaling: pd.DataFrame, minimum: float, world: int, label: str = "") -> list[dict]:
    name = f"strong-scaling efficiency at {world} GPUs{label}"
    target = f">= {minimum:.0%}"
    strong = _mode(scaling, "strong")
    if strong.empty or strong["efficiency_mean"].isna().all():
        return [_row(name, target, world, note="no strong-scaling runs with a 1-GPU reference")]
    largest = int(strong["world_size"].max())
    rows = []
    if world in set(strong["world_size"]):
        rows.append(_strong_row(name, target, strong, world, minimum, informative=False))
    else:
        rows.append(_row(name, target, world, status=_absent(world, strong["world_size"])))
    if largest != world and largest > 1:
        informative = f"strong-scaling efficiency at largest measured N={largest}{label}"
        rows.append(_strong_row(informative, target, strong, largest, minimum, informative=True))
    return rows


def _absent(world: int, measured: pd.Series) -> str:
    largest = int(measured.max())
    if world > largest:
        return f"{NOT_MEASURED} (largest N={largest})"
    return f"{NOT_MEASURED} (N={world} is not in the grid)"


REMEASURE = "snakemake ... --forcerun $(python -m scalestudy.analysis.contention targets)"


def _no_verdict(name, target, world, value, table: pd.DataFrame, worlds) -> dict | None:
    """The row of a criterion whose points at `worlds` did not fill their window or were
    contended, saying why; None where they can be judged."""
    rows = table[table["world_size"].isin(list(worlds))]
    unfilled = sorted(int(w) for w in rows.loc[~window_filled(rows), "world_size"])
    if unfilled:
        note = (
            f"no verdict: the measurement window was not filled at N={_worlds(unfilled)} (whole-run "
            "throughput, one-off costs included); give those runs more epochs or a shorter train.measure"
        )
        return _row(name, target, world, value, f"{NOT_MEASURED} (window not filled)", note)
    shared = rows[contended(rows)]
    if shared.empty:
        return None
    evidence = "; ".join(str(e) for e in shared.get("contention", pd.Series(dtype=str)).dropna() if str(e))
    note = (
        f"no verdict: the GPUs were shared with a foreign process while N={_worlds(shared['world_size'])} "
        f"measured ({evidence or 'contended'}); re-measure those points: {REMEASURE}"
    )
    return _row(name, target, world, value, f"{NOT_MEASURED} (contended)", note)


def _worlds(worlds) -> str:
    return ", ".join(str(int(w)) for w in sorted(set(worlds)))


def _strong_row(name, target, strong, world, minimum, informative):
    r = strong[strong["world_size"] == world].iloc[0]
    value = float(r["efficiency_mean"])
    unjudged = _no_verdict(name, target, world, value, strong, (1, world))
    if unjudged:
        return unjudged
    ci = (float(r["efficiency_ci_low"]), float(r["efficiency_ci_high"]))
    flagged = _above_ideal(name, target, world, value, strong, [world], informative, ci)
    if flagged:
        return flagged
    note = _ci_note(value, ci, minimum, int(r["repeats"]), higher_is_better=True)
    if informative:
        note = ("meets" if value >= minimum else "below") + f" the threshold; {note}"
    return _row(name, target, world, value, _verdict(value >= minimum, informative), note, ci)


def _above_ideal(name, target, world, value, table, worlds, informative, ci=(math.nan, math.nan)):
    """The row of a criterion one of whose points at `worlds` has an efficiency above 100 %: the
    value kept, no verdict (informative rows stay informative), and why; None where none has."""
    rows = table[table["world_size"].isin(list(worlds)) & above_ideal.flagged(table)]
    if rows.empty:
        return None
    said = "; ".join(
        above_ideal.words(r["efficiency_mean"], r["world_size"], r.get("mode", ""))
        for _, r in rows.iterrows()
    )
    note = f"no verdict: {said}; {above_ideal.REMEASURE}"
    return _row(name, target, world, value, INFORMATIVE if informative else ABOVE_IDEAL, note, ci)


def _ci_note(value, ci, threshold, repeats, higher_is_better) -> str:
    if repeats < 2 or math.isnan(ci[0]):
        return f"{repeats} repeat(s): no confidence interval"
    if ci[0] <= threshold <= ci[1]:
        return f"{repeats} repeats; the interval contains the threshold: not decisive"
    return f"{repeats} repeats; the interval clears the threshold"


def weak_variation(scaling: pd.DataFrame, maximum: float, world: int, label: str = "") -> list[dict]:
    """Largest step-time increase T(N)/T(1) - 1 over the weak-scaling sizes N <= world."""
    name = f"weak-scaling step-time variation over N <= {world}{label}"
    target = f"<= {maximum:.0%}"
    weak = _mode(scaling, "weak")
    if weak.empty or 1 not in set(weak["world_size"]):
        return [_row(name, target, world, note="no weak-scaling runs with a 1-GPU reference")]
    largest = int(weak["world_size"].max())
    if world in set(weak["world_size"]):
        return [_weak_row(name, target, weak, world, maximum, informative=False)]
    rows = [_row(name, target, world, status=_absent(world, weak["world_size"]))]
    if 1 < largest < world:
        informative = f"weak-scaling step-time variation over measured N <= {largest}{label}"
        rows.append(_weak_row(informative, target, weak, largest, maximum, informative=True))
    return rows


def _weak_row(name, target, weak, world, maximum, informative):
    step = weak.set_index("world_size")["time_per_step_s_mean"]
    reference = step.loc[1]
    within = step[step.index <= world]
    variation = within / reference - 1.0
    worst_n = int(variation.idxmax())
    value = float(variation.max())
    unjudged = _no_verdict(name, target, worst_n, value, weak, within.index)
    if unjudged:
        return unjudged
    above = weak[weak["world_size"].isin(within.index) & above_ideal.flagged(weak)]
    if not above.empty:  # its step time fell below the 1-rank reference's: the row says by how much
        first = int(above["world_size"].min())
        return _above_ideal(name, target, first, float(variation.loc[first]), weak, [first], informative)
    note = f"worst at N={worst_n}: {within.loc[worst_n]:.4g} s vs {reference:.4g} s per step at N=1"
    if informative:
        note = ("meets" if value <= maximum else "exceeds") + f" the limit; {note}"
    return _row(name, target, worst_n, value, _verdict(value <= maximum, informative), note)


def optimisation_gain(sensitivity: pd.DataFrame, minimum: float) -> list[dict]:
    name = "throughput gain per GPU of the best optimisation over the baseline"
    target = f">= {minimum:.0%}"
    usable = sensitivity.dropna(subset=["gain_vs_baseline"]) if len(sensitivity) else sensitivity
    if usable.empty:
        return [_row(name, target, math.nan, note="needs the baseline and at least one sensitivity run")]
    baseline_filled = bool(usable.get("baseline_window_filled", pd.Series([True])).all())
    baseline_shared = bool(flags(usable, "baseline_contended").any())
    filled = usable[window_filled(usable)]
    if filled.empty or not baseline_filled:
        which = "the baseline" if not baseline_filled else "any sensitivity run"
        note = f"no verdict: the measurement window was not filled in {which} (whole-run throughput)"
        return [_row(name, target, math.nan, status=f"{NOT_MEASURED} (window not filled)", note=note)]
    usable = filled[~contended(filled)]
    if usable.empty or baseline_shared:
        which = "the baseline" if baseline_shared else "every sensitivity run"
        note = f"no verdict: the GPUs of {which} were shared with a foreign process; re-measure: {REMEASURE}"
        return [_row(name, target, math.nan, status=f"{NOT_MEASURED} (contended)", note=note)]
    best = usable.loc[usable["images_per_s_per_gpu"].idxmax()]
    value = float(best["gain_vs_baseline"])
    note = (
        f"best point {sweep_point(best, sensitivity)} at N={int(best['world_size'])}: "
        f"{best['images_per_s_per_gpu']:.4g} vs baseline {best['baseline_images_per_s_per_gpu']:.4g} "
        f"{rate_words(sensitivity)} (one run each)"
    )
    if len(usable) < len(filled):
        note += f"; {len(filled) - len(usable)} contended sweep point(s) not judged"
    return [_row(name, target, int(best["world_size"]), value, _verdict(value >= minimum, False), note)]


def rate_words(table: pd.DataFrame, per: str | None = None) -> str:
    """'images/s per GPU' for the ResNet (as its tables always said), '<unit>/s per rank' otherwise."""
    unit = series.sample_unit(table)
    return f"{unit}/s per {per or ('GPU' if unit == 'images' else 'rank')}"


# sensitivity.csv: the columns after "best" (but sample_unit) are the sweep's further axes (metrics)
AXIS_DEFAULTS = {"parallelism": series.DDP}  # what an empty cell (the key left at its default) means
POINT_WORDS = {"precision": "{}", "per_gpu_batch": "per-GPU batch {:.0f}", "bucket_cap_mb": "bucket {:g} MB"}


def sweep_point(best: pd.Series, sensitivity: pd.DataFrame) -> str:
    """The best sweep point in words: its precision, batch and bucket, then every further axis."""
    columns = list(sensitivity.columns)
    extra = columns[columns.index("best") + 1 :] if "best" in columns else []
    words = [
        form.format(best[key]) for key, form in POINT_WORDS.items() if key in best and pd.notna(best[key])
    ]
    for key in (c for c in extra if c != "sample_unit"):
        words.append(f"{key} {best[key] if pd.notna(best[key]) else AXIS_DEFAULTS.get(key, '(default)')}")
    return ", ".join(words)


def gpu_health(gpus: pd.DataFrame | None, thresholds: dict, reasons: Sequence[str] = ()) -> list[dict]:
    """The GPU monitor's criteria on each GPU's mean over the measurement window (monitor_window.per_gpu)."""
    sm_min, watts_min = thresholds["sm_active_pct_min"], thresholds["power_w_min"]
    fraction_min, pcie_max = thresholds["power_fraction_min"], thresholds["pcie_gb_s_max"]
    least = "of the least loaded GPU"
    specs = [
        ("sm_active_pct", "SM activity (NVML GPM) " + least, f">= {sm_min:g}%", sm_min / 100, 0.01),
        ("power_fraction", "power draw / power limit " + least, f">= {fraction_min:.0%}", fraction_min, 1),
    ]
    if watts_min is not None:
        specs.append(("power_w", "power draw " + least, f">= {watts_min:g} W", watts_min, 1))
    judged, left_out = _judged_gpus(gpus, thresholds["min_window_samples"])
    rows = [_gpu_row(judged, *spec, reasons, left_out) for spec in specs]
    pcie = ("pcie_gb_s", "PCIe traffic (rx + tx) of the busiest GPU", f"<= {pcie_max:g} GB/s", pcie_max, 1)
    return [*rows, _gpu_row(judged, *pcie, reasons, left_out, higher_is_better=False)]


def _judged_gpus(gpus: pd.DataFrame | None, min_samples: int) -> tuple[pd.DataFrame | None, dict[str, int]]:
    """The GPUs a health verdict may come from: not of a contended run (a foreign process on one of
    its GPUs in the window) and with at least `min_samples` samples in the window; and how many GPUs
    each reason left out."""
    if gpus is None or gpus.empty:
        return gpus, {}
    foreign = pd.to_numeric(gpus.get("foreign_samples", pd.Series(0, index=gpus.index)), errors="coerce")
    shared_runs = set(gpus.loc[foreign.fillna(0) > 0, "run"])
    shared = gpus["run"].isin(shared_runs)
    short = ~shared & (gpus["samples"] < min_samples)
    left_out = {
        "contended": int(shared.sum()),
        f"fewer than {min_samples} samples in the window": int(short.sum()),
    }
    return gpus[~shared & ~short], {why: n for why, n in left_out.items() if n}


def _gpu_row(gpus, column, name, target, threshold, scale, reasons, left_out, higher_is_better=True) -> dict:
    if left_out and (gpus is None or gpus.empty):
        status = "contended" if "contended" in left_out else "window too short"
        return _row(name, target, math.nan, status=f"{NOT_MEASURED} ({status})", note=_left_out(left_out))
    if gpus is None or gpus.empty:
        why = "; ".join(reasons) or "no gpu_monitor.csv given"
        return _row(name, target, math.nan, note=f"no GPU monitor samples: {why}")
    measured = gpus.dropna(subset=[column])
    if measured.empty:
        names = ", ".join(sorted(set(gpus["gpu_name"].astype(str))))
        note = f"{names}: not reported by NVML"
        if column == "sm_active_pct":
            low, high = gpus["kernel_active_pct"].min(), gpus["kernel_active_pct"].max()
            note = f"{names}: no NVML GPM (Hopper or newer)"
            if pd.notna(low):
                note += f"; NVML utilization (time any kernel ran, not SM activity) was {low:.0f}-{high:.0f}%"
        return _row(name, target, math.nan, status=f"{NOT_MEASURED} ({column} unsupported)", note=note)
    worst = measured.loc[measured[column].idxmin() if higher_is_better else measured[column].idxmax()]
    value = float(worst[column]) * scale
    ok = value >= threshold if higher_is_better else value <= threshold
    span = "measurement window" if measured["windowed"].all() else "whole run where no window was recorded"
    note = (
        f"worst: {worst['gpu_uuid']} on {worst['host']} in {worst['run']}; mean over the {span}; "
        f"{len(measured)} GPU(s) in {measured['run'].nunique()} run(s)"
    )
    if len(measured) < len(gpus):
        note += f"; {len(gpus) - len(measured)} GPU(s) without this metric not counted"
    if left_out:
        note += f"; {_left_out(left_out)}"
    return _row(name, target, int(worst["world_size"]), value, _verdict(ok, False), note)


def _left_out(left_out: dict[str, int]) -> str:
    return "no verdict from " + ", ".join(f"{n} GPU(s) {why}" for why, n in left_out.items())


def evaluate(
    scaling: pd.DataFrame,
    sensitivity: pd.DataFrame,
    criteria: dict,
    gpus: pd.DataFrame | None = None,
    monitor: dict | None = None,
    monitor_reasons: Sequence[str] = (),
) -> pd.DataFrame:
    rows = [
        *scaling_criteria(scaling, criteria),
        *optimisation_gain(sensitivity, criteria["optimisation_gain_min"]),
    ]
    if monitor is not None:
        rows += gpu_health(gpus, monitor, monitor_reasons)
    return pd.DataFrame(rows, columns=list(COLUMNS))


BUSBW_COLUMNS = ("collective", "world_size", "placement", "bytes", "time_s", "busbw_gb_s")


def busbw_rows(busbw: pd.DataFrame | None, minimum: float | None) -> list[dict]:
    """All-reduce bus bandwidth at the largest benchmarked message, per world size and placement
    (scalestudy.preflight.collectives), against analysis.acceptance.busbw_min_gb_s (informative when null)."""
    name = "all-reduce bus bandwidth at the largest message (comm_bench)"
    target = f">= {minimum:g} GB/s" if minimum is not None else "no link rate configured, GB/s"
    measured = None
    if busbw is not None:
        measured = busbw[(busbw["collective"] == "all_reduce") & busbw["time_s"].notna()]
    if measured is None or measured.empty:
        return [_row(name, target, math.nan, note="no all-reduce measured (comm_bench runs world sizes > 1)")]
    rows = []
    for (world, placement), group in measured.groupby(["world_size", "placement"]):
        largest = group.loc[group["bytes"].idxmax()]
        value = float(largest["busbw_gb_s"])
        note = f"{int(largest['bytes']):,} B, {largest['backend']}, mean of {int(largest['repeats'])} calls"
        status = _verdict(value >= minimum, False) if minimum is not None else INFORMATIVE
        rows.append(_row(f"{name}, {placement}", target, int(world), value, status, note))
    return rows


def loader_rows(smoke_io: dict | None, scaling: pd.DataFrame) -> list[dict]:
    """The loader alone (smoke test) against the training throughput per rank it must feed."""
    name = "data loader alone / training throughput per rank"
    target = f">= 1{TIMES}"
    if smoke_io is None:
        return [_row(name, target, math.nan, note="no smoke test result given")]
    column = "images_per_s_per_gpu_mean"
    if column not in scaling or scaling[column].dropna().empty:
        return [_row(name, target, math.nan, note="no scaling runs to compare with")]
    scaling = scaling[~contended(scaling)]  # a shared GPU's throughput would flatter the loader
    if scaling[column].dropna().empty:
        note = f"every scaling point was contended; re-measure: {REMEASURE}"
        return [_row(name, target, math.nan, status=f"{NOT_MEASURED} (contended)", note=note)]
    fastest = scaling.loc[scaling[column].idxmax()]
    loader_result = smoke_io["loader"]
    value = loader_result["images_per_s"] / float(fastest[column])
    rate = f"{loader_result['images_per_s']:.4g} {rate_words(scaling, 'rank')}"
    which = (
        fastest["mode"]
        if len(series.by_parallelism(scaling)) == 1
        else f"{fastest['mode']} {series.parallelism_of(scaling)[fastest.name]}"
    )
    note = (
        f"{loader_result['loader']} loader {rate} on "
        f"{loader_result['device']} vs {float(fastest[column]):.4g} trained ({which}, "
        f"N={int(fastest['world_size'])}, the fastest per rank)"
    )
    return [_row(name, target, int(fastest["world_size"]), value, _verdict(value >= 1.0, False), note)]


STATUS_COLOURS = {PASS: "#d4edda", FAIL: "#f8d7da", INFORMATIVE: "#e2e3e5"}


def to_html(table: pd.DataFrame) -> str:
    """A self-contained HTML table for the Snakemake report, pass/fail coloured."""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in table.columns)
    body = []
    for _, row in table.iterrows():
        colour = STATUS_COLOURS.get(str(row["status"]).split(" (")[0], "#fff3cd")
        cells = "".join(f"<td>{html.escape(_cell(row[c], c, row['target']))}</td>" for c in table.columns)
        body.append(f'<tr style="background:{colour}">{cells}</tr>')
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>Acceptance</title>"
        "<style>table{border-collapse:collapse;font-family:sans-serif;font-size:13px}"
        "td,th{border:1px solid #999;padding:4px 8px;text-align:left}</style></head><body>"
        f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></body></html>\n"
    )


ABSOLUTE_UNITS = (" GB/s", " W")  # a target ending in one: its measured value is in that unit, not a ratio
TIMES = "x"  # a target ending in it ('>= 1x'): its measured value is a ratio, read in times


def format_measured(value: float, target: str) -> str:
    """A measured value as its criterion states it: 0.93 -> '93.0%', 12.3 for '<= 20 GB/s' -> '12.3 GB/s',
    52.47 for '>= 1x' -> '52.5x' (a ratio in times)."""
    unit = next((u for u in ABSOLUTE_UNITS if str(target).endswith(u)), None)
    if unit:
        return f"{value:.3g}{unit}"
    return f"{value:.3g}{TIMES}" if str(target).endswith(TIMES) else f"{value:.1%}"


def _cell(value, column: str, target: str = "") -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "n/a"
        if column in ("measured", "ci_low", "ci_high"):
            return format_measured(value, target)
        return f"{value:g}"
    return str(value)


def main(argv: Sequence[str] | None = None) -> int:
    parser = cli.parser(__doc__.splitlines()[0])
    parser.add_argument("--scaling", required=True, help="scaling.csv (from analysis.metrics).")
    parser.add_argument("--sensitivity", required=True, help="sensitivity.csv (from analysis.metrics).")
    parser.add_argument("--out", required=True, help="Acceptance CSV to write.")
    parser.add_argument("--html", help="Also write the table as HTML (for the report).")
    parser.add_argument("--monitor", nargs="*", help="gpu_monitor.csv of the scaling runs (GPU health rows).")
    parser.add_argument("--busbw", help="results/comm/busbw.csv (collective benchmark rows).")
    parser.add_argument("--loader-smoke", help="results/smoke/io.json (the loader smoke test).")
    args = parser.parse_args(argv)
    settings = cli.start(args)
    scaling = read_csv(args.scaling, ["mode", "world_size", "efficiency_mean", "time_per_step_s_mean"])
    sensitivity = read_csv(args.sensitivity, ["gain_vs_baseline", "images_per_s_per_gpu"])
    samples, reasons = monitor_window.load(args.monitor or [])
    gpus = monitor_window.per_gpu(samples) if args.monitor is not None else None
    table = evaluate(scaling, sensitivity, settings["acceptance"], gpus, settings["monitor"], reasons)
    if args.busbw or args.loader_smoke:
        busbw = read_csv(args.busbw, BUSBW_COLUMNS) if args.busbw else None
        smoke_io = read_json(args.loader_smoke) if args.loader_smoke else None
        extra = busbw_rows(busbw, settings["acceptance"]["busbw_min_gb_s"]) + loader_rows(smoke_io, scaling)
        table = pd.concat([table, pd.DataFrame(extra, columns=list(COLUMNS))], ignore_index=True)
    atomic.write_csv(args.out, table)
    if args.html:
        atomic.write_text(args.html, to_html(table))
    for _, row in table.iterrows():
        measured = _cell(row["measured"], "measured", row["target"])
        log.info("%s: %s (%s)", row["criterion"], row["status"], measured)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
