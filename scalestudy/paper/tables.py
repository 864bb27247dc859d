"""LaTeX tables (booktabs) for the paper, from the analysis tables.

Each table is a complete `table` float (caption, label, tabular with top/mid/bottom rules) to
`\\input{}`; the paper needs `\\usepackage{booktabs}` and `\\usepackage{array}`. Missing values
print as "n/a" (e.g. the confidence interval of a single repeat), never as a made-up number.

    python -m scalestudy.paper --scaling results/tables/scaling.csv \
        --sensitivity results/tables/sensitivity.csv --acceptance results/tables/acceptance.csv \
        --resources results/tables/resource_estimate.csv --comm-fit results/tables/comm_model_fit.csv \
        --out-dir results/paper
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from scalestudy import atomic, commandline
from scalestudy.analysis import above_ideal, graphs
from scalestudy.analysis.acceptance import format_measured
from scalestudy.analysis.metrics import DEFAULT_AXES, PRECISION_ORDER
from scalestudy.analysis.series import parallelism_of
from scalestudy.analysis.tableio import read_csv
from scalestudy.progress import setup_logging

log = logging.getLogger("scalestudy.paper")

NA = "n/a"
_SPECIAL = {
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "\\": r"\textbackslash{}",
    "<": r"\textless{}",  # OT1 fonts print < and > as inverted ! and ?
    ">": r"\textgreater{}",
}


def escape(text: Any) -> str:
    return re.sub(r"[&%$#_{}~^\\<>]", lambda m: _SPECIAL[m.group()], str(text))


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA


def prose(words: Any) -> str:
    """Text for LaTeX with its percent signs as the tables set them: '100 %' -> '100\\,\\%'."""
    return escape(words).replace(r" \%", r"\,\%")


def number(digits: int = 3) -> Callable[[Any], str]:
    """`digits` significant digits below 1000, thousands-separated integers above; n/a when missing."""

    def fmt(value: Any) -> str:
        if _missing(value):
            return NA
        value = float(value)
        if math.isinf(value):
            return r"$\infty$" if value > 0 else r"$-\infty$"
        if abs(value) >= 1000:
            return f"{value:,.0f}".replace(",", "{,}")
        return f"{value:.{digits}g}"

    return fmt


def fixed(decimals: int = 2) -> Callable[[Any], str]:
    return lambda value: NA if _missing(value) else f"{float(value):.{decimals}f}"


def percent(digits: int = 1) -> Callable[[Any], str]:
    return lambda value: NA if _missing(value) else f"{100 * float(value):.{digits}f}\\,\\%"


def integer(value: Any) -> str:
    return NA if _missing(value) else f"{int(value):d}"


def text(value: Any) -> str:
    return NA if _missing(value) else escape(value)


def relation(value: Any) -> str:
    """'>= 70%' -> '$\\geq$ 70\\,\\%' (targets of the acceptance table)."""
    if _missing(value):
        return NA
    symbols = {">=": r"$\geq$", "<=": r"$\leq$"}
    parts = re.split(r"(>=|<=)", str(value))
    return "".join(symbols.get(part) or escape(part).replace(r"\%", r"\,\%") for part in parts)


def blank(value: Any) -> str:
    """Empty for not-applicable cells (e.g. GPUs of a whole stage)."""
    return "" if _missing(value) or value == "" else integer(value)


def ragged(width: float) -> str:
    """A wrapping, left-aligned column of `width` times the line width (needs the array package)."""
    return rf">{{\raggedright\arraybackslash}}p{{{width}\linewidth}}"


@dataclass(frozen=True)
class Column:
    key: str
    header: str
    fmt: Callable[[Any], str] = text
    align: str = "r"


def booktabs(frame: pd.DataFrame, columns: Sequence[Column], caption: str, label: str, note: str = "") -> str:
    """A complete booktabs table float."""
    spec = "".join(c.align for c in columns)
    lines = [
        r"\begin{table}[tbp]",
        r"\centering",
        rf"\caption{{{caption}}}",
        rf"\label{{tab:{label}}}",
        r"\small",
        rf"\begin{{tabular}}{{{spec}}}",
        r"\toprule",
        " & ".join(c.header for c in columns) + r" \\",
        r"\midrule",
    ]
    lines += [" & ".join(c.fmt(row[c.key]) for c in columns) + r" \\" for _, row in frame.iterrows()]
    lines += [r"\bottomrule", r"\end{tabular}"]
    if note:
        lines += [r"\par\smallskip", rf"{{\footnotesize {note}\par}}"]
    lines += [r"\end{table}", ""]
    return "\n".join(lines)


def interval(frame: pd.DataFrame, stem: str, fmt: Callable[[Any], str]) -> pd.Series:
    """'[low, high]' of a statistic, or 'n/a (n=1)' when there is no interval."""

    def one(row) -> str:
        low, high = row[f"{stem}_ci_low"], row[f"{stem}_ci_high"]
        if _missing(low) or _missing(high):
            return f"{NA} (n={int(row['repeats'])})"
        return f"[{fmt(low)}, {fmt(high)}]"

    return frame.apply(one, axis=1) if len(frame) else pd.Series(dtype=object)


def capitalised(word: str) -> str:
    return f"{word[:1].upper()}{word[1:]}"


def sample_unit(frame: pd.DataFrame) -> str:
    """What the table's throughput counts (its sample_unit column), images where it has none."""
    values = frame["sample_unit"].dropna() if "sample_unit" in frame else []
    return str(values.iloc[0]) if len(values) else "images"


def efficiency_table(scaling: pd.DataFrame, confidence: float = 0.95, unit: str = "GPU") -> str:
    """One row per (mode, world size); with DDP and FSDP in the study, per (mode, parallelism, world
    size), with a Parallelism column."""
    frame = scaling.copy()
    frame["parallelism"] = parallelism_of(frame)
    frame = frame.sort_values(["mode", "parallelism", "world_size"])
    frame["efficiency_ci"] = interval(frame, "efficiency", percent())
    flagged = above_ideal.flagged(frame)
    frame["efficiency_shown"] = [
        percent()(value) + (ABOVE_IDEAL_MARK if above else "")
        for value, above in zip(frame["efficiency_mean"], flagged, strict=True)
    ]
    frame["throughput_shown"] = marked_throughput(frame, "images_per_s_mean")
    series = [Column("parallelism", "Parallelism", lambda v: escape(str(v).upper()), align="l")]
    columns = [
        Column("mode", "Mode", align="l"),
        *(series if frame["parallelism"].nunique() > 1 else []),
        Column("world_size", f"{capitalised(unit)}s", integer),
        Column("per_gpu_batch", f"Batch/{unit}", integer),
        Column("throughput_shown", f"{capitalised(sample_unit(frame))}/s", str),
        Column("speedup_mean", "Speedup", fixed(2)),
        Column("efficiency_shown", "Efficiency", str),
        Column("efficiency_ci", f"{confidence:.0%} CI".replace("%", r"\,\%"), str),
        Column("mfu_mean", "MFU", percent()),
        Column("repeats", "Runs", integer),
    ]
    note = (
        "Efficiency $E(N) = X(N)/(N\\,X(1))$ with $X$ the global throughput (strong: $T(1)/(N\\,T(N))$ per "
        "epoch; weak: $T(1)/T(N)$ per step); means over repeats, Student-$t$ intervals."
    )
    if flagged.any():
        note += f" {ABOVE_IDEAL_MARK} {prose(above_ideal.NOTE)}."
    note += graphs_note(frame)
    note += mfu_missing(frame, "mfu_mean")
    if len(frame) and int(frame["world_size"].max()) == 1:
        note += f" One {unit} only: each efficiency is its reference itself; no scaling was measured."
    return booktabs(frame, columns, "Strong- and weak-scaling throughput and efficiency.", "efficiency", note)


ABOVE_IDEAL_MARK = r"$^{\dagger}$"  # an efficiency above 100 % (scalestudy.analysis.above_ideal)
GRAPHS_SKIPPED_MARK = r"$^{\ddagger}$"  # a compiled step whose CUDA graphs were skipped (analysis.graphs)
GRAPHS_SKIPPED_NOTE = "Inductor skipped the CUDA graphs of the compiled step: not the fast step"


def graphs_skipped(frame: pd.DataFrame) -> pd.Series:
    """Rows measured (in some repeat) without the CUDA graphs their compiled step should have
    replayed: the sensitivity table's cuda_graphs_skipped, the scaling table's repeats_graphs_skipped."""
    if "repeats_graphs_skipped" in frame:
        return pd.to_numeric(frame["repeats_graphs_skipped"], errors="coerce").fillna(0) > 0
    return graphs.flags(frame, graphs.COLUMN)


def marked_throughput(frame: pd.DataFrame, column: str, digits: int = 4) -> list[str]:
    """The throughput column's numbers, with GRAPHS_SKIPPED_MARK where graphs_skipped."""
    lost = graphs_skipped(frame)
    return [
        number(digits)(value) + (GRAPHS_SKIPPED_MARK if skip else "")
        for value, skip in zip(frame[column], lost, strict=True)
    ]


def graphs_note(frame: pd.DataFrame) -> str:
    return f" {GRAPHS_SKIPPED_MARK} {GRAPHS_SKIPPED_NOTE}." if graphs_skipped(frame).any() else ""


def mfu_missing(frame: pd.DataFrame, column: str) -> str:
    """' MFU n/a: <why>.' for the rows whose MFU is empty (metrics' mfu_note: no peak known for the
    device, ...), else ''."""
    if column not in frame or "mfu_note" not in frame:
        return ""
    empty = frame[pd.to_numeric(frame[column], errors="coerce").isna()]
    reasons = [str(why) for why in dict.fromkeys(empty["mfu_note"].dropna()) if str(why)]
    return f" MFU n/a: {prose('; '.join(reasons))}." if reasons else ""


def measured(value: Any, target: Any) -> str:
    """An acceptance row's measured value as its criterion states it (acceptance.format_measured:
    a percentage, a rate in GB/s or W, or a ratio in times), for LaTeX."""
    if _missing(value):
        return NA
    return escape(format_measured(float(value), str(target))).replace(r"\%", r"\,\%")


def _axis_column(key: str, unit: str) -> Column:
    known = {
        "precision": Column("precision", "Precision", align="l"),
        "per_gpu_batch": Column("per_gpu_batch", f"Batch/{unit}", integer),
        "bucket_cap_mb": Column("bucket_cap_mb", "Bucket (MB)", number(3)),
    }
    return known.get(key, Column(key, escape(key).replace(r"\_", " "), text, align="l"))


def sensitivity_table(
    sensitivity: pd.DataFrame, unit: str = "GPU", axes: Sequence[str] = DEFAULT_AXES
) -> str:
    """One row per sweep point: a column per axis (sensitivity.axes), sorted by them (precision in
    PRECISION_ORDER: fp32, tf32, fp16, bf16)."""
    keys = [key if key != "precision" else "_order" for key in axes]
    rank = {name: place for place, name in enumerate(PRECISION_ORDER)}  # another precision: last
    frame = sensitivity.assign(_order=sensitivity["precision"].map(rank).fillna(len(rank)))
    frame = frame.sort_values(keys, kind="stable")
    best = (
        frame["best"].astype(str).str.lower() == "true" if "best" in frame else pd.Series(False, frame.index)
    )
    frame["throughput"] = [
        (rf"\textbf{{{shown}}}" if b else shown)
        for shown, b in zip(marked_throughput(frame, "images_per_s_per_gpu"), best, strict=True)
    ]
    columns = [
        *(_axis_column(key, unit) for key in axes),
        Column("throughput", f"{capitalised(sample_unit(frame))}/s/{unit}", str),
        Column("gain_vs_baseline", "vs.\\ baseline", percent()),
        Column("mfu", "MFU", percent()),
    ]
    world = int(frame["world_size"].iloc[0]) if len(frame) else 0
    return booktabs(
        frame,
        columns,
        f"Sensitivity sweep at {world} {unit}s (best point in bold).",
        "sensitivity",
        f"Gain: throughput per {unit} over the one-{unit} baseline; one run per point."
        + graphs_note(frame)
        + mfu_missing(frame, "mfu"),
    )


def acceptance_table(acceptance: pd.DataFrame, unit: str = "GPU") -> str:
    # a row judged from a point above 100 % says so in its note (analysis.acceptance): marked here
    above = acceptance["note"].fillna("").astype(str).str.contains(above_ideal.CHECK, regex=False)
    acceptance = acceptance.assign(
        shown=[
            measured(v, t) + (ABOVE_IDEAL_MARK if a else "")
            for v, t, a in zip(acceptance["measured"], acceptance["target"], above, strict=True)
        ]
    )
    note = (
        "``not measured'': the grid does not reach that size; ``informative'' rows show the same "
        "quantity at the largest measured size."
    )
    if above.any():
        note += f" {ABOVE_IDEAL_MARK} No verdict: a point's {prose(above_ideal.NOTE)}."
    columns = [
        Column("criterion", "Criterion", relation, align=ragged(0.34)),
        Column("target", "Target", relation, align=ragged(0.13)),
        Column("world_size", "$N$", integer),
        Column("shown", "Measured", str),
        Column("status", "Status", align=ragged(0.17)),
    ]
    return booktabs(
        acceptance,
        columns,
        "Acceptance criteria.",
        "acceptance",
        note,
    )


def resource_table(resources: pd.DataFrame, unit: str = "GPU") -> str:
    columns = [
        Column("scope", "Scope", align="l"),
        Column("what", "What", align="l"),
        Column("mode", "Mode", align="l"),
        *([Column("parallelism", "Parallelism", align="l")] if "parallelism" in resources else []),
        Column("world_size", f"{unit[:1].upper()}{unit[1:]}s", blank),
        Column("nodes", "Nodes", blank),
        Column("runs", "Runs", blank),
        Column("wall_hours", "Wall (h)", number(3)),
        Column("gpu_hours", f"{unit}-h", number(3)),
        Column("node_hours", "Node-h", number(3)),
        Column("requested_gpu_hours", f"Request {unit}-h", number(3)),
        *([Column("kwh", "kWh", number(3))] if "kwh" in resources else []),
    ]
    return booktabs(
        resources.fillna({"mode": "", "parallelism": ""}),
        columns,
        "Resource estimate.",
        "resources",
        f"Request: {unit}-hours times the configured overhead factor; ``model'' rows are predictions of "
        "the communication model, not measurements; kWh: the GPUs' energy (measured, or estimated from "
        "measured power; n/a where not measured).",
    )


QUANTITY_LABELS = {
    "degrees_of_freedom": "degrees of freedom",
    "alpha_eff": r"latency $\alpha_\mathrm{eff}$",
    "bandwidth_eff": r"bandwidth $1/\beta_\mathrm{eff}$",
    "rms_residual": "RMS residual",
    "overlap_fraction": r"overlap $\varphi$",
}
UNIT_LABELS = {"us": r"$\mu$s"}


def comm_model_table(fit: pd.DataFrame, unit: str = "GPU") -> str:
    frame = fit.fillna({"unit": "", "note": ""})
    # a value that is text (the fit method) goes to the wide note column: the value column stays narrow
    frame["note"] = [
        escape(note) if _is_number(v) else "; ".join(filter(None, [text(v), escape(note)]))
        for v, note in zip(frame["value"], frame["note"], strict=True)
    ]
    frame["shown"] = [number(4)(float(v)) if _is_number(v) else "" for v in frame["value"]]
    frame["label"] = [QUANTITY_LABELS.get(q, escape(q).replace(r"\_", " ")) for q in frame["quantity"]]
    frame["unit"] = [UNIT_LABELS.get(u, escape(u)) if not _missing(u) else "" for u in frame["unit"]]
    columns = [
        Column("label", "Quantity", str, align="l"),
        Column("shown", "Value", str),
        Column("unit", "Unit", str, align="l"),
        Column("note", "Note", str, align=ragged(0.4)),
    ]
    return booktabs(
        frame,
        columns,
        "Alpha-beta ring all-reduce model fitted to the measured step times.",
        "comm-model",
    )


def _is_number(value: Any) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


TABLES = {
    "scaling": ("efficiency.tex", efficiency_table),
    "sensitivity": ("sensitivity.tex", sensitivity_table),
    "acceptance": ("acceptance.tex", acceptance_table),
    "resources": ("resource_estimate.tex", resource_table),
    "comm_fit": ("comm_model.tex", comm_model_table),
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = commandline.parser(__doc__)
    parser.add_argument("--log-level", default="INFO")
    for name in TABLES:
        parser.add_argument(f"--{name.replace('_', '-')}", help=f"{name} CSV (from scalestudy.analysis).")
    parser.add_argument("--out-dir", required=True, help="Folder for the .tex files.")
    parser.add_argument("--unit", default="GPU", help="What one rank drives, in the headers: GPU or rank.")
    parser.add_argument(
        "--sensitivity-axes",
        nargs="+",
        default=list(DEFAULT_AXES),
        help="The sensitivity sweep's axes (sensitivity.axes keys, in order): its first columns.",
    )
    args = parser.parse_args(argv)
    setup_logging(getattr(logging, args.log_level.upper(), logging.INFO))
    for name, (filename, render) in TABLES.items():
        source = getattr(args, name)
        if source is None:
            continue
        out = Path(args.out_dir) / filename
        options = {"axes": args.sensitivity_axes} if name == "sensitivity" else {}
        atomic.write_text(out, render(read_csv(source), unit=args.unit, **options))
        log.info("%s -> %s", source, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
