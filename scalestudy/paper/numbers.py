"""Every number of the paper's text as a named LaTeX macro (results/paper/numbers.tex).

Each macro carries a comment naming the table, the row and the run ids it was drawn from, so a
number in the PDF can be traced back to the runs. A table that was not given, or a point the grid
does not reach, gives "not measured", never a made-up value. Macro names hold no digits (LaTeX
forbids them): world sizes are spelled, \\StrongEffAtEight.

    python -m scalestudy.paper.numbers --table scaling=results/tables/scaling.csv \
        runs=results/tables/runs.csv ... --context-json '{"data_source": "synthetic", ...}' \
        --out results/paper/numbers.tex

The tables it knows (TABLES below) are all optional; the rule (rules/paper.smk, PAPER_DATA) passes
those the workflow makes.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from scalestudy import atomic, commandline
from scalestudy.analysis.metrics import DEFAULT_AXES, SERIES_DEFAULTS
from scalestudy.analysis.tableio import read_csv
from scalestudy.paper import comparison, discussion, energy, execution, results, sections, waterfall
from scalestudy.paper.macros import NOT_MEASURED, Numbers
from scalestudy.plan import paths, schema
from scalestudy.progress import setup_logging

log = logging.getLogger("scalestudy.paper.numbers")

# name -> file it usually is (for messages); every one is optional.
TABLES = {
    "runs": f"{paths.TABLES_DIR}/runs.csv",
    "scaling": f"{paths.TABLES_DIR}/scaling.csv",
    "sensitivity": f"{paths.TABLES_DIR}/sensitivity.csv",
    "acceptance": f"{paths.TABLES_DIR}/acceptance.csv",
    "resources": f"{paths.TABLES_DIR}/resource_estimate.csv",
    "comm_fit": f"{paths.TABLES_DIR}/comm_model_fit.csv",
    "comm_prediction": f"{paths.TABLES_DIR}/comm_model_prediction.csv",
    "profile_breakdown": f"{paths.PROFILE_DIR}/breakdown.csv",
    "profile_overlap": f"{paths.PROFILE_DIR}/overlap.csv",
    "system": f"{paths.TABLES_DIR}/system.csv",
    "comm_bench_fit": f"{paths.TABLES_DIR}/comm_bench_fit.csv",
    "busbw": f"{paths.COMM_DIR}/busbw.csv",
    "comparison": f"{paths.TABLES_DIR}/comparison.csv",
    "waterfall": f"{paths.TABLES_DIR}/waterfall.csv",
}

# What the config tells that no table does (the rule passes these from the config), else the schema's
# defaults. workload and sample_unit are the study's (scalestudy.workloads.of_config); runs.csv's own
# columns win where it has them (a catalog without them: SERIES_DEFAULTS). parallelism:
# scaling.parallelism; sensitivity_axes: sensitivity.axes keys.
CONTEXT_DEFAULTS = {
    "title": schema.node("study", "title")["default"],
    "data_source": "synthetic",
    "device": "cpu",
    "confidence": schema.node("analysis", "confidence")["default"],
    "workload": SERIES_DEFAULTS["workload"],
    "sample_unit": SERIES_DEFAULTS["sample_unit"],
    "parallelism": list(schema.node("scaling", "parallelism")["default"]),
    "sensitivity_axes": list(DEFAULT_AXES),
    "compared_with": "",  # compare.label (or the other study's folder) where compare.against is set
    "min_window_samples": schema.node("analysis", "monitor", "min_window_samples")["default"],
}


def build(tables: dict[str, pd.DataFrame | None], context: dict[str, Any]) -> Numbers:
    """Every section writer's macros, from the tables given (a table not given: "not measured")."""
    numbers = Numbers()
    data = sections.Data(tables, {**CONTEXT_DEFAULTS, **context})
    writers = (
        *sections.SECTIONS,
        *results.SECTIONS,
        *waterfall.SECTIONS,
        *discussion.SECTIONS,
        *energy.SECTIONS,
        *execution.SECTIONS,  # after energy: its sentence quotes \SacctEnergy
        *comparison.SECTIONS,
    )
    for write in writers:
        write(numbers, data)
    return numbers


def parse_table_args(pairs: Sequence[str]) -> dict[str, Path]:
    out = {}
    for pair in pairs:
        name, sep, path = pair.partition("=")
        if not sep or not path:
            raise SystemExit(f"--table {pair!r}: expected NAME=PATH")
        if name not in TABLES:
            raise SystemExit(f"--table {name}: unknown table (known: {', '.join(TABLES)})")
        if not Path(path).is_file():
            raise SystemExit(f"--table {name}: file not found: {path}")
        out[name] = Path(path)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = commandline.parser(__doc__)
    parser.add_argument(
        "--table",
        action="extend",
        nargs="+",
        default=[],
        metavar="NAME=PATH",
        help="Tables (NAME in TABLES).",
    )
    parser.add_argument(
        "--context-json", default="{}", help="Config values (title, data_source, device, ...)."
    )
    parser.add_argument("--out", required=True, help="numbers.tex to write.")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    setup_logging(getattr(logging, args.log_level.upper(), logging.INFO))
    try:
        context = json.loads(args.context_json)
    except json.JSONDecodeError as error:
        raise SystemExit(f"--context-json: not JSON ({error})") from None
    unknown = set(context) - set(CONTEXT_DEFAULTS)
    if unknown:
        raise SystemExit(
            f"--context-json: unknown keys {sorted(unknown)} (known: {sorted(CONTEXT_DEFAULTS)})"
        )
    given = parse_table_args(args.table)
    tables = {name: read_csv(path) for name, path in given.items()}
    for name in TABLES:
        if name not in tables:
            log.info("table %s not given: its numbers read '%s'", name, NOT_MEASURED)
    numbers = build(tables, context)
    header = "\n".join(f"table {name}: {path}" for name, path in given.items())
    atomic.write_text(args.out, numbers.render(header))
    log.info("%d macros -> %s", len(numbers.macros), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
