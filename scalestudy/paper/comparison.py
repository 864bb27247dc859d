"""The macros of the paper's comparison with another study (compare.against; scalestudy.compare):
how many grid points were faster, slower, not significantly different or not tested, which ran in
one study only, and the throughput ratio (this study / the other). Without a comparison every macro
says so ("not measured"; \\ComparedWith names no study)."""

from __future__ import annotations

from scalestudy.compare import points
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


def comparison(numbers: Numbers, data: Data) -> None:
    table = data.table("comparison")
    label = data.context.get("compared_with") or ""
    if table is None or table.empty:
        numbers.add("ComparedWith", "no other study (compare.against is not set)", "config compare.against")
        for name in (*COUNTS, "ComparisonMatched", "ComparisonNotTested", "ComparisonConfigsDiffer"):
            numbers.add(name, NOT_MEASURED, f"{SOURCE} (no comparison)")
        for name in (
            "ComparisonMedianRatio",
            "ComparisonRatioRange",
            "ComparisonConfidence",
            "ComparisonEnergy",
        ):
            numbers.add(name, NOT_MEASURED, f"{SOURCE} (no comparison)")
        return
    numbers.add("ComparedWith", escape(label or "the other study"), "config compare.label / compare.against")
    verdicts = table["verdict"].astype(str)
    for name, verdict in COUNTS.items():
        numbers.add(name, str(int(verdicts.eq(verdict).sum())), f"{SOURCE} verdict == '{verdict}'")
    matched = table[table["repeats_a"].gt(0) & table["repeats_b"].gt(0)]
    numbers.add("ComparisonMatched", str(len(matched)), f"{SOURCE} rows in both studies")
    numbers.add(
        "ComparisonNotTested",
        str(int(verdicts.str.startswith(points.NOT_TESTED).sum())),
        f"{SOURCE} verdict 'not tested' (fewer than two repeats on a side)",
    )
    numbers.add(
        "ComparisonConfigsDiffer",
        str(int(matched["match"].astype(str).str.startswith("run configs differ").sum())),
        f"{SOURCE} match 'run configs differ'",
    )
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
