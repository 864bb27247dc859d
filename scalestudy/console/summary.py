"""The demo's closing summary: where the study's products are, its headline numbers, MLflow.

Everything is read from what the workflow wrote under results/: the report, the paper (its PDF, or
the .tex where no LaTeX built one), the crate and its file count, the tables; the headline numbers
from results/tables/scaling.csv (per series: the rate at one rank and at the largest N, speedup and
efficiency there) and acceptance.csv (how many criteria passed, failed, ...); MLflow's command and
link from the tracking job's record (results/logs/tracking/sync.json). What is missing is said so.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import pandas as pd

from scalestudy.plan import paths

SYNC_RECORD = f"{paths.LOGS_DIR}/tracking/sync.json"  # rules/track.smk's output


def _relative(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def where(root: Path) -> list[str]:
    """The report, the paper, the crate and the tables: one line each."""
    results = root / paths.RESULTS_DIR
    report = results / "report.html"
    paper = root / paths.PAPER_DIR
    pdf, tex = paper / "paper.pdf", paper / "paper.tex"
    crate, crate_zip = root / paths.CRATE_DIR, root / f"{paths.CRATE_DIR}.zip"
    tables = root / paths.TABLES_DIR
    lines = [f"  report: {_relative(report, root) if report.is_file() else 'not written'}"]
    if pdf.is_file():
        lines.append(f"  paper:  {_relative(pdf, root)} (its source beside it)")
    else:
        lines.append(
            f"  paper:  {_relative(tex, root) if tex.is_file() else 'not written'} (no PDF: no LaTeX here)"
        )
    if crate_zip.is_file():
        files = _crate_files(crate)
        size = crate_zip.stat().st_size / 1e6
        lines.append(
            f"  crate:  {_relative(crate_zip, root)} ({files} files, {size:.1f} MB; check it: "
            f"python -m scalestudy.crate validate {_relative(crate_zip, root)})"
        )
    else:
        lines.append("  crate:  not written (crate.enabled: false?)")
    csvs = sorted(tables.glob("*.csv")) if tables.is_dir() else []
    runs = tables / "runs.csv"
    count = f"; runs.csv: {len(pd.read_csv(runs))} runs" if runs.is_file() else ""
    lines.append(f"  tables: {_relative(tables, root)}/ ({len(csvs)} CSV files{count})")
    return lines


def _crate_files(crate: Path) -> int | str:
    try:
        graph = json.loads((crate / "ro-crate-metadata.json").read_text())["@graph"]
    except (OSError, ValueError, KeyError):
        return "?"
    return sum(1 for entity in graph if "File" in entity.get("@type", []))


def _number(value) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def headline(root: Path) -> list[str]:
    """Per scaling series: the rate at N=1 and at the largest N, speedup and efficiency there; the
    acceptance criteria counted by status."""
    lines = []
    scaling = root / paths.TABLES_DIR / "scaling.csv"
    if scaling.is_file():
        table = pd.read_csv(scaling)
        for (mode, parallelism), series in table.groupby(["mode", "parallelism"], sort=False):
            series = series.sort_values("world_size")
            first, last = series.iloc[0], series.iloc[-1]
            unit = str(first["sample_unit"])
            rate = _number(first["images_per_s_mean"])
            line = f"  {mode} scaling ({parallelism}): {rate} {unit}/s at N={first['world_size']}"
            if len(series) > 1:
                line += f", {_number(last['images_per_s_mean'])} at N={last['world_size']}"
                efficiency = 100 * last.get("efficiency_mean", math.nan)
                if math.isfinite(efficiency):
                    line += f": speedup {last['speedup_mean']:.2f}, efficiency {efficiency:.1f} %"
            lines.append(line)
    else:
        lines.append("  scaling: no results/tables/scaling.csv")
    acceptance = root / paths.TABLES_DIR / "acceptance.csv"
    if acceptance.is_file():
        statuses = Counter(str(status).split(" (")[0] for status in pd.read_csv(acceptance)["status"])
        counted = ", ".join(f"{count} {status}" for status, count in statuses.most_common())
        lines.append(f"  acceptance criteria: {counted} ({_relative(acceptance, root)})")
    return lines


def mlflow(root: Path) -> list[str]:
    """The command that serves the runs' store and the link to them, from the tracking job's record."""
    record_path = root / SYNC_RECORD
    try:
        record = json.loads(record_path.read_text())
    except (OSError, ValueError):
        return ["MLflow: no record of the tracking job (tracking.enabled: false?)"]
    lines = []
    if record.get("ui_command"):
        lines.append(f"MLflow: {record['ui_command']}")
        lines.append(f"  then open {record.get('ui', 'its runs')}")
    else:
        lines.append(f"MLflow: the runs at {record.get('ui', record.get('uri', 'the tracking server'))}")
    return lines


def summary(root: Path, name: str = "demo", seconds: float | None = None) -> list[str]:
    took = f" in {int(seconds // 60)} min {int(seconds % 60)} s" if seconds is not None else ""
    return [
        f"{name}: done{took}. The study, under {(root / paths.RESULTS_DIR).resolve()}:",
        *where(root),
        "Headline numbers (results/tables):",
        *headline(root),
        *mlflow(root),
    ]
