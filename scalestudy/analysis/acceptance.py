"""The study's acceptance criteria, each with its measured value and pass / fail.

A criterion at a world size the grid does not reach is "not measured (largest N=...)", never a
pass; the same quantity at the largest measured N follows as an "informative" row.

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
from scalestudy.analysis import cli
from scalestudy.analysis.tableio import read_csv

log = logging.getLogger("scalestudy.analysis.acceptance")

COLUMNS = ("criterion", "target", "world_size", "measured", "ci_low", "ci_high", "status", "note")
PASS, FAIL, NOT_MEASURED, INFORMATIVE = "pass", "fail", "not measured", "informative"


def _row(criterion, target, world, measured=math.nan, status=NOT_MEASURED, note="", ci=(math.nan, math.nan)):
    return dict(zip(COLUMNS, (criterion, target, world, measured, ci[0], ci[1], status, note), strict=True))


def _verdict(ok: bool, informative: bool) -> str:
    if informative:
        return INFORMATIVE
    return PASS if ok else FAIL


def _mode(scaling: pd.DataFrame, mode: str) -> pd.DataFrame:
    return scaling[scaling["mode"] == mode].sort_values("world_size") if len(scaling) else scaling


def strong_efficiency(scaling: pd.DataFrame, minimum: float, world: int) -> list[dict]:
    name = f"strong-scaling efficiency at {world} GPUs"
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
        label = f"strong-scaling efficiency at largest measured N={largest}"
        rows.append(_strong_row(label, target, strong, largest, minimum, informative=True))
    return rows


def _absent(world: int, measured: pd.Series) -> str:
    largest = int(measured.max())
    if world > largest:
        return f"{NOT_MEASURED} (largest N={largest})"
    return f"{NOT_MEASURED} (N={world} is not in the grid)"


def _strong_row(name, target, strong, world, minimum, informative):
    r = strong[strong["world_size"] == world].iloc[0]
    value = float(r["efficiency_mean"])
    ci = (float(r["efficiency_ci_low"]), float(r["efficiency_ci_high"]))
    note = _ci_note(value, ci, minimum, int(r["repeats"]), higher_is_better=True)
    if informative:
        note = ("meets" if value >= minimum else "below") + f" the threshold; {note}"
    return _row(name, target, world, value, _verdict(value >= minimum, informative), note, ci)


def _ci_note(value, ci, threshold, repeats, higher_is_better) -> str:
    if repeats < 2 or math.isnan(ci[0]):
        return f"{repeats} repeat(s): no confidence interval"
    if ci[0] <= threshold <= ci[1]:
        return f"{repeats} repeats; the interval contains the threshold: not decisive"
    return f"{repeats} repeats; the interval clears the threshold"


def weak_variation(scaling: pd.DataFrame, maximum: float, world: int) -> list[dict]:
    """Largest step-time increase T(N)/T(1) - 1 over the weak-scaling sizes N <= world."""
    name = f"weak-scaling step-time variation over N <= {world}"
    target = f"<= {maximum:.0%}"
    weak = _mode(scaling, "weak")
    if weak.empty or 1 not in set(weak["world_size"]):
        return [_row(name, target, world, note="no weak-scaling runs with a 1-GPU reference")]
    largest = int(weak["world_size"].max())
    if world in set(weak["world_size"]):
        return [_weak_row(name, target, weak, world, maximum, informative=False)]
    rows = [_row(name, target, world, status=_absent(world, weak["world_size"]))]
    if 1 < largest < world:
        label = f"weak-scaling step-time variation over measured N <= {largest}"
        rows.append(_weak_row(label, target, weak, largest, maximum, informative=True))
    return rows


def _weak_row(name, target, weak, world, maximum, informative):
    step = weak.set_index("world_size")["time_per_step_s_mean"]
    reference = step.loc[1]
    within = step[step.index <= world]
    variation = within / reference - 1.0
    worst_n = int(variation.idxmax())
    value = float(variation.max())
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
    best = usable.loc[usable["images_per_s_per_gpu"].idxmax()]
    value = float(best["gain_vs_baseline"])
    note = (
        f"best point {best['precision']}, per-GPU batch {int(best['per_gpu_batch'])}, bucket "
        f"{best['bucket_cap_mb']:g} MB at N={int(best['world_size'])}: {best['images_per_s_per_gpu']:.4g} vs "
        f"baseline {best['baseline_images_per_s_per_gpu']:.4g} images/s per GPU (one run each)"
    )
    return [_row(name, target, int(best["world_size"]), value, _verdict(value >= minimum, False), note)]


def evaluate(scaling: pd.DataFrame, sensitivity: pd.DataFrame, criteria: dict) -> pd.DataFrame:
    rows = [
        *strong_efficiency(scaling, criteria["strong_efficiency_min"], criteria["strong_efficiency_world"]),
        *weak_variation(scaling, criteria["weak_variation_max"], criteria["weak_variation_world"]),
        *optimisation_gain(sensitivity, criteria["optimisation_gain_min"]),
    ]
    return pd.DataFrame(rows, columns=list(COLUMNS))


STATUS_COLOURS = {PASS: "#d4edda", FAIL: "#f8d7da", INFORMATIVE: "#e2e3e5"}


def to_html(table: pd.DataFrame) -> str:
    """A self-contained HTML table for the Snakemake report, pass/fail coloured."""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in table.columns)
    body = []
    for _, row in table.iterrows():
        colour = STATUS_COLOURS.get(str(row["status"]).split(" (")[0], "#fff3cd")
        cells = "".join(f"<td>{html.escape(_cell(row[c], c))}</td>" for c in table.columns)
        body.append(f'<tr style="background:{colour}">{cells}</tr>')
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>Acceptance</title>"
        "<style>table{border-collapse:collapse;font-family:sans-serif;font-size:13px}"
        "td,th{border:1px solid #999;padding:4px 8px;text-align:left}</style></head><body>"
        f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></body></html>\n"
    )


def _cell(value, column: str) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "n/a"
        if column in ("measured", "ci_low", "ci_high"):
            return f"{value:.1%}"
        return f"{value:g}"
    return str(value)


def main(argv: Sequence[str] | None = None) -> int:
    parser = cli.parser(__doc__.splitlines()[0])
    parser.add_argument("--scaling", required=True, help="scaling.csv (from analysis.metrics).")
    parser.add_argument("--sensitivity", required=True, help="sensitivity.csv (from analysis.metrics).")
    parser.add_argument("--out", required=True, help="Acceptance CSV to write.")
    parser.add_argument("--html", help="Also write the table as HTML (for the report).")
    args = parser.parse_args(argv)
    settings = cli.start(args)
    scaling = read_csv(args.scaling, ["mode", "world_size", "efficiency_mean", "time_per_step_s_mean"])
    sensitivity = read_csv(args.sensitivity, ["gain_vs_baseline", "images_per_s_per_gpu"])
    table = evaluate(scaling, sensitivity, settings["acceptance"])
    atomic.write_csv(args.out, table)
    if args.html:
        atomic.write_text(args.html, to_html(table))
    for _, row in table.iterrows():
        log.info("%s: %s (%s)", row["criterion"], row["status"], _cell(row["measured"], "measured"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
