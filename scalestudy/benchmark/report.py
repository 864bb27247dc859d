"""Benchmark rows -> medians, ratios against a baseline row, MFU, targets; a table and a CSV."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from scalestudy.atomic import write_text
from scalestudy.benchmark.measure import median
from scalestudy.plan.runfiles import NOT_MEASURED

COLUMNS = (
    "section",
    "name",
    "settings",
    "median",
    "unit",
    "repeats",
    "min",
    "max",
    "ratio",
    "vs",
    "mfu_pct",
)


@dataclass(frozen=True)
class Row:
    """One measured thing: its repeats, and optionally what it is compared to and its FLOPs per item.

    `baseline` names the row of the same section the ratio is taken against (median / median).
    `flops_per_item` turns a rate into FLOP/s for MFU (training: FLOPs per image).
    """

    section: str
    name: str
    unit: str
    samples: tuple[float, ...]
    settings: str = ""
    baseline: str | None = None
    flops_per_item: float | None = None

    @property
    def median(self) -> float:
        return median(self.samples)


@dataclass(frozen=True)
class Target:
    """A bound on a row's ratio (on="ratio"), median (on="value") or MFU in % (on="mfu_pct"); None
    bounds are not checked."""

    label: str
    section: str
    name: str
    on: str = "ratio"
    minimum: float | None = None
    maximum: float | None = None

    def met(self, value: float) -> bool:
        low_ok = self.minimum is None or value >= self.minimum
        high_ok = self.maximum is None or value <= self.maximum
        return low_ok and high_ok

    def bound(self) -> str:
        parts = [f">= {self.minimum:g}"] if self.minimum is not None else []
        parts += [f"<= {self.maximum:g}"] if self.maximum is not None else []
        return " and ".join(parts)


TARGET_COLUMNS = {"ratio": "ratio", "value": "median", "mfu_pct": "mfu_pct"}  # Target.on -> column


@dataclass
class Check:
    target: Target
    value: float | None
    met: bool | None = field(init=False)

    def __post_init__(self) -> None:
        self.met = None if self.value is None else self.target.met(self.value)


def mfu(items_per_s: float, flops_per_item: float, peak_flops_per_s: float) -> float:
    """Model FLOPs utilisation: achieved model FLOP/s over the peak (here: a measured matmul rate)."""
    if peak_flops_per_s <= 0:
        raise ValueError(f"the peak rate must be positive, got {peak_flops_per_s}")
    return items_per_s * flops_per_item / peak_flops_per_s


def records(
    rows: Sequence[Row], peak_flops_per_s: float | None = None, context: dict | None = None
) -> list[dict]:
    """One dict per row with COLUMNS (ratio vs its baseline row, MFU in %) plus the context columns."""
    by_key = {(row.section, row.name): row for row in rows}
    out = []
    for row in rows:
        base = by_key.get((row.section, row.baseline)) if row.baseline else None
        if row.baseline and base is None:
            raise ValueError(f"row {row.name!r}: no baseline row {row.baseline!r} in section {row.section!r}")
        use_mfu = row.flops_per_item is not None and peak_flops_per_s
        record: dict[str, Any] = {
            "section": row.section,
            "name": row.name,
            "settings": row.settings,
            "median": row.median,
            "unit": row.unit,
            "repeats": len(row.samples),
            "min": min(row.samples),
            "max": max(row.samples),
            "ratio": row.median / base.median if base else None,
            "vs": row.baseline,
            "mfu_pct": 100 * mfu(row.median, row.flops_per_item, peak_flops_per_s) if use_mfu else None,
        }
        out.append({**record, **(context or {})})
    return out


def check_targets(targets: Iterable[Target], table: Sequence[dict]) -> list[Check]:
    by_key = {(record["section"], record["name"]): record for record in table}
    checks = []
    for target in targets:
        record = by_key.get((target.section, target.name))
        value = None if record is None else record[TARGET_COLUMNS[target.on]]
        checks.append(Check(target, value))
    return checks


def format_number(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if not isinstance(value, float):
        return str(value)
    magnitude = abs(value)
    if magnitude >= 1000:
        return f"{value:,.0f}"
    return f"{value:.3g}" if magnitude < 100 else f"{value:.1f}"


def format_table(table: Sequence[dict], columns: Sequence[str] = COLUMNS) -> str:
    """A plain-text table, one line per record, columns padded to their widest cell."""
    cells = [list(columns)] + [[format_number(record.get(column)) for column in columns] for record in table]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)) for line in cells]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(line.rstrip() for line in lines)


def format_checks(checks: Sequence[Check]) -> str:
    verdict = {True: "met", False: "NOT MET", None: NOT_MEASURED}
    lines = []
    for check in checks:
        value, bound = format_number(check.value), check.target.bound()
        lines.append(f"{check.target.label}: {value} (target {bound}): {verdict[check.met]}")
    return "\n".join(lines)


def write_csv(path, table: Sequence[dict]) -> None:
    """Every record as one CSV line (the union of their keys as the header), written atomically."""
    header = list(dict.fromkeys(key for record in table for key in record))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=header, lineterminator="\n")
    writer.writeheader()
    writer.writerows(table)
    write_text(path, buffer.getvalue())
