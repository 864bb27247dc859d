"""The macros of the paper's comparison with another study (compare.against; scalestudy.compare):
how many grid points were faster, slower, not significantly different or not tested, which (named),
what the verdicts rest on (repeats, or one run's within-run spread), which ran in one study only,
the throughput ratio (this study / the other) and, where the two are not the same experiment (run
configs that differ beyond compare.axis, compared under compare.allow_different), a sentence saying
so. Without a comparison every macro says so ("not measured"; \\ComparedWith names no study)."""

from __future__ import annotations

import json

import pandas as pd

from scalestudy.compare import points, report, spread
from scalestudy.paper.macros import NOT_MEASURED, Numbers
from scalestudy.paper.sections import Data
from scalestudy.paper.tables import escape, number, percent

SOURCE = "comparison.csv"
COUNTS = {
    "ComparisonFaster": points.FASTER,
    "ComparisonSlower": points.SLOWER,
    "ComparisonSame": points.SAME,
    "ComparisonOnlyThere": points.ONLY_A,  # the other study is A
    "ComparisonOnlyHere": points.ONLY_B,
}
NAMED = {"ComparisonSlowerPoints": points.SLOWER, "ComparisonFasterPoints": points.FASTER}
TEXTS = ("ComparisonMedianRatio", "ComparisonRatioRange", "ComparisonConfidence", "ComparisonEnergy")


def _absent(numbers: Numbers) -> None:
    # the template's comparison section only where there is a comparison (TeX's \iftrue/\iffalse)
    numbers.add("ComparisonMade", r"\iffalse", f"{SOURCE} not given (compare.against is not set)")
    numbers.add("ComparedWith", "no other study (compare.against is not set)", "config compare.against")
    names = (*COUNTS, "ComparisonMatched", "ComparisonNotTested", "ComparisonConfigsDiffer", *NAMED, *TEXTS)
    for name in names:
        numbers.add(name, NOT_MEASURED, f"{SOURCE} (no comparison)")
    numbers.add("ComparisonBasis", f"on nothing ({NOT_MEASURED})", f"{SOURCE} (no comparison)")
    numbers.add("ComparisonNotSame", "", f"{SOURCE} (no comparison)")
    numbers.add("ComparisonApart", "", f"{SOURCE} (no comparison)")


def _names(rows: pd.DataFrame) -> str:
    fmt = number(3)
    return ", ".join(
        escape(f"{r.stage}/{r.point}") + f" ({fmt(r.throughput_ratio)})" for r in rows.itertuples()
    )


def _named(matched: pd.DataFrame, verdict: str) -> str:
    return _names(matched[matched["verdict"].astype(str).eq(verdict)])


def _apart(matched: pd.DataFrame) -> str:
    """A sentence naming the points 10 % or more apart without a verdict (report.APART), or ""."""
    found = report.apart(matched)
    if found.empty:
        return ""
    return f"Apart by {percent(0)(report.APART)} or more without a verdict: {_names(found)}."


def _not_same(matched: pd.DataFrame) -> str:
    found: dict[str, list] = {}
    differ = matched[matched["match"].astype(str).eq(points.CONFIGS_DIFFER)]
    for cell in differ.get("config_differences_json", pd.Series(dtype=str)).dropna():
        for key, values in json.loads(cell).items():
            found.setdefault(key, values)
    if not found:
        return ""
    keys = ", ".join(escape(f"{key} ({a} vs {b})") for key, (a, b) in sorted(found.items()))
    return (
        f"The two are not the same experiment: at {len(differ)} of {len(matched)} matched points their run "
        f"configurations differ in {keys} (compared anyway: compare.allow\\_different)."
    )


def comparison(numbers: Numbers, data: Data) -> None:
    table = data.table("comparison")
    label = data.context.get("compared_with") or ""
    if table is None or table.empty:
        _absent(numbers)
        return
    numbers.add("ComparisonMade", r"\iftrue", f"{SOURCE} given")
    numbers.add("ComparedWith", escape(label or "the other study"), "config compare.label / compare.against")
    verdicts = table["verdict"].astype(str)
    for name, verdict in COUNTS.items():
        numbers.add(name, str(int(verdicts.eq(verdict).sum())), f"{SOURCE} verdict == '{verdict}'")
    matched = table[table["repeats_a"].gt(0) & table["repeats_b"].gt(0)]
    numbers.add("ComparisonMatched", str(len(matched)), f"{SOURCE} rows in both studies")
    numbers.add(
        "ComparisonNotTested",
        str(int(verdicts.str.startswith(points.NOT_TESTED).sum())),
        f"{SOURCE} verdict 'not tested' (one repeat on a side without window sub-interval rates)",
    )
    numbers.add(
        "ComparisonConfigsDiffer",
        str(int(matched["match"].astype(str).eq(points.CONFIGS_DIFFER).sum())),
        f"{SOURCE} match '{points.CONFIGS_DIFFER}'",
    )
    for name, verdict in NAMED.items():
        numbers.add(name, _named(matched, verdict) or "none", f"{SOURCE} points with verdict '{verdict}'")
    basis = matched.get("verdict_basis", pd.Series(dtype=str)).astype(str)
    numbers.add(
        "ComparisonBasis",
        f"on the repeats at {int(basis.eq(spread.REPEATS).sum())} points and on one repeat per side at "
        f"{int(basis.eq(spread.WITHIN).sum())} (each run's spread of its window's sub-interval rates, "
        "taken as the uncertainty of a run: run-to-run variation unmeasured)",
        f"{SOURCE} verdict_basis",
    )
    numbers.add("ComparisonNotSame", _not_same(matched), f"{SOURCE} config_differences_json")
    numbers.add("ComparisonApart", _apart(matched), f"{SOURCE} throughput_ratio of points without a verdict")
    _ratios(numbers, table, matched)


def _ratios(numbers: Numbers, table: pd.DataFrame, matched: pd.DataFrame) -> None:
    ratios = matched["throughput_ratio"].dropna()
    fmt = number(3)
    numbers.add(
        "ComparisonMedianRatio",
        fmt(ratios.median()) if len(ratios) else NOT_MEASURED,
        f"{SOURCE} median throughput_ratio",
    )
    numbers.add(
        "ComparisonRatioRange",
        f"{fmt(ratios.min())} to {fmt(ratios.max())}" if len(ratios) else NOT_MEASURED,
        f"{SOURCE} min and max throughput_ratio",
    )
    numbers.add("ComparisonConfidence", percent(0)(table["confidence"].iloc[0]), f"{SOURCE} confidence")
    measured = bool(table["energy_measured"].astype(str).str.lower().eq("true").any())
    numbers.add(
        "ComparisonEnergy",
        "compared where both studies measured it" if measured else NOT_MEASURED,
        f"{SOURCE} energy_measured",
    )


SECTIONS = (comparison,)
