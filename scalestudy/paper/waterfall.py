"""The macros of the paper's waterfall paragraph: where each mode's largest multi-rank DDP point lost
its efficiency (results/tables/waterfall.csv, scalestudy.analysis.waterfall), in points of
efficiency, and every point whose remainder exceeds the table's unexplained_share_max.

Per mode (Strong, Weak): \\WaterfallStrongWorld, \\WaterfallStrongLoss (points lost),
\\WaterfallStrongComm, ...Data, ...Host, ...Straggler, ...Remainder (points; "not measured" where a
part was not), ...RemainderShare, and \\WaterfallStrongSummary, the sentence the template prints
("In strong scaling at 8 GPUs, 19 of the 28 points of efficiency lost are exposed all-reduce, ...").
\\WaterfallUnexplained says where the remainder exceeds its bound (or that it nowhere does).
"""

from __future__ import annotations

import pandas as pd

from scalestudy.paper.macros import NOT_MEASURED, Numbers
from scalestudy.paper.sections import Data, ddp_rows, is_missing, join
from scalestudy.paper.tables import escape, number, percent

PART_MACROS = {
    "Comm": "exposed_comm",
    "Data": "data_wait",
    "Host": "host_overhead",
    "Straggler": "straggler",
    "Remainder": "remainder",
}
# How each part reads in a sentence: "2 are <phrase>"
PHRASES = {
    "data_wait": "waiting for the data loader",
    "host_overhead": "host and launch overhead",
    "straggler": "waiting for the slowest rank",
}
MACROS = ("World", "Loss", *PART_MACROS, "RemainderShare", "Summary")


def points(value) -> str:
    return NOT_MEASURED if is_missing(value) else number(2)(value)


def waterfall(numbers: Numbers, data: Data) -> None:
    table = data.table("waterfall")
    rows = table[ddp_rows(table)] if table is not None else None
    for mode in ("strong", "weak"):
        Mode = mode.capitalize()
        chosen = rows[rows["mode"] == mode] if rows is not None else pd.DataFrame()
        if chosen.empty:
            why = (
                "waterfall.csv not given"
                if table is None
                else f"waterfall.csv: no multi-rank {mode} DDP point"
            )
            for name in MACROS[:-1]:
                numbers.add(f"Waterfall{Mode}{name}", NOT_MEASURED, why)
            numbers.add(f"Waterfall{Mode}Summary", f"The {mode}-scaling losses were not measured.", why)
            continue
        row = chosen.sort_values("world_size").iloc[-1]
        world = int(row["world_size"])
        source = f"waterfall.csv mode={mode} world_size={world}; " + data.run_ids(
            "scaling", **{"config.mode": mode, "world_size": world}
        )
        numbers.add(f"Waterfall{Mode}World", str(world), source)
        numbers.add(f"Waterfall{Mode}Loss", points(row["loss_points"]), source + "; loss_points")
        for name, part in PART_MACROS.items():
            numbers.add(f"Waterfall{Mode}{name}", points(row[f"{part}_points"]), source + f"; {part}_points")
        numbers.add(
            f"Waterfall{Mode}RemainderShare",
            NOT_MEASURED if is_missing(row["remainder_share"]) else percent(0)(row["remainder_share"]),
            source + "; remainder_share",
        )
        numbers.add(f"Waterfall{Mode}Summary", summary(mode, row, data), source + "; every part")
    unexplained(numbers, rows, data)


def summary(mode: str, row: pd.Series, data: Data) -> str:
    """'In strong scaling at 8 GPUs, 19 of the 28 points of efficiency lost are exposed all-reduce,
    2 are waiting for the data loader, ...; 2 points (7 %) remain unexplained.'"""
    world = int(row["world_size"])
    at = f"In {mode} scaling at {world} {data.unit if world == 1 else data.units}"
    loss = row["loss_points"]
    if is_missing(loss) or not loss > 0:
        return f"{at}, no efficiency is lost against the ideal: there is nothing to split."
    comm = row["exposed_comm_points"]
    if is_missing(comm):
        head = f"{at}, {points(loss)} points of efficiency are lost; the exposed all-reduce was not measured"
    elif comm > loss:
        head = (
            f"{at}, {points(loss)} points of efficiency are lost, and the exposed all-reduce alone"
            f" accounts for {points(comm)}"
        )
    else:
        head = f"{at}, {points(comm)} of the {points(loss)} points of efficiency lost are exposed all-reduce"
    measured = [
        f"{points(row[f'{p}_points'])} {phrase}"
        for p, phrase in PHRASES.items()
        if not is_missing(row[f"{p}_points"])
    ]
    missing = [
        f"{phrase} was not measured ({escape(_reason(row[f'{p}_how']))})"
        for p, phrase in PHRASES.items()
        if is_missing(row[f"{p}_points"])
    ]
    remainder, share = row["remainder_points"], row["remainder_share"]
    rest = (
        f"{points(remainder)} points ({percent(0)(share)} of the loss) remain unexplained"
        if remainder >= 0
        else f"the parts exceed the loss by {points(-remainder)} points ({percent(0)(-share)} of it)"
    )
    return "; ".join([head + (", " + join(measured) if measured else ""), *missing, rest]) + "."


def _reason(how) -> str:
    return str(how).removeprefix(NOT_MEASURED).lstrip(" :")


def unexplained(numbers: Numbers, rows: pd.DataFrame | None, data: Data) -> None:
    """Every point whose remainder exceeds the bound, or that none does."""
    if rows is None or rows.empty:
        numbers.add("WaterfallShareMax", NOT_MEASURED, "waterfall.csv not given or empty")
        numbers.add("WaterfallUnexplained", "", "waterfall.csv not given or empty")
        return
    bound = percent(0)(rows["unexplained_share_max"].iloc[0])
    numbers.add("WaterfallShareMax", bound, "waterfall.csv unexplained_share_max (analysis.waterfall)")
    flagged = rows[rows["unexplained_flagged"].astype(str).str.lower() == "true"]
    if flagged.empty:
        numbers.add(
            "WaterfallUnexplained",
            f"At every point the remainder stays within {bound} of the loss.",
            "waterfall.csv unexplained_flagged (none)",
        )
        return
    points_named = [
        f"{r['mode']} scaling at {int(r['world_size'])} {data.units} ({percent(0)(r['remainder_share'])}, "
        f"{'unexplained' if r['remainder_share'] > 0 else 'over-explained'})"
        for _, r in flagged.sort_values(["mode", "world_size"]).iterrows()
    ]
    numbers.add(
        "WaterfallUnexplained",
        f"The remainder exceeds {bound} of the loss at {join(points_named)}: there the named parts do "
        "not account for the loss, and the figure's remainder shows by how much.",
        "waterfall.csv unexplained_flagged, remainder_share",
    )


SECTIONS = (waterfall,)
