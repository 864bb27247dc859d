"""The macros of the paper's waterfall paragraph: where each mode's largest multi-rank DDP point lost
its efficiency (results/tables/waterfall.csv, scalestudy.analysis.waterfall), in points of
efficiency, and every point whose remainder exceeds the table's unexplained_share_max.

Per mode (Strong, Weak): \\WaterfallStrongWorld, \\WaterfallStrongLoss (points lost),
\\WaterfallStrongComm, ...Data, ...Host, ...Straggler, ...Remainder (points; "not measured" where a
part was not), ...RemainderShare, and \\WaterfallStrongSummary, the sentence the template prints
("In strong scaling at 8 GPUs, 19 of the 28 points of efficiency lost are exposed all-reduce, ...").
\\WaterfallUnexplained says where the remainder exceeds its bound (or that it nowhere does).

A point with no loss is not split (analysis.waterfall): its Remainder and RemainderShare read
"none: no loss to split", not "not measured", and the summary says why: efficiency above 100 % is to
be checked (scalestudy.analysis.above_ideal), and a study of one GPU has no scaling loss
(waterfall.csv's 1-rank rows), which the summary says rather than leaving the paragraph empty.
"""

from __future__ import annotations

import pandas as pd

from scalestudy.analysis import above_ideal
from scalestudy.paper.macros import NOT_MEASURED, Numbers
from scalestudy.paper.sections import Data, ddp_rows, is_missing, join
from scalestudy.paper.tables import escape, number, percent, prose

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
NOT_SPLIT = "none: no loss to split"
ONE_RANK = "none: one rank has no scaling loss"


def points(value) -> str:
    return NOT_MEASURED if is_missing(value) else number(2)(value)


def waterfall(numbers: Numbers, data: Data) -> None:
    table = data.table("waterfall")
    rows = table[ddp_rows(table)] if table is not None else None
    for mode in ("strong", "weak"):
        Mode = mode.capitalize()
        chosen = rows[rows["mode"] == mode] if rows is not None else pd.DataFrame()
        if not chosen.empty and (chosen["world_size"] == 1).all():
            one_rank(numbers, mode, chosen, data)
            continue
        chosen = chosen[chosen["world_size"] > 1] if not chosen.empty else chosen
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
        split = not is_missing(row["remainder_points"])  # a point with no loss is not split
        for name, part in PART_MACROS.items():
            value = points(row[f"{part}_points"]) if split or part != "remainder" else NOT_SPLIT
            numbers.add(f"Waterfall{Mode}{name}", value, source + f"; {part}_points")
        share = row["remainder_share"]
        numbers.add(
            f"Waterfall{Mode}RemainderShare",
            NOT_SPLIT if not split else NOT_MEASURED if is_missing(share) else percent(0)(share),
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
    if above_ideal.row_flagged(row, "efficiency"):
        return (
            f"{at}, the efficiency is {percent()(row['efficiency'])}, above the ideal; "
            f"{prose(above_ideal.CHECK)}; there is no loss to split."
        )
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


def one_rank(numbers: Numbers, mode: str, rows: pd.DataFrame, data: Data) -> None:
    """A series of one rank only (a one-GPU study): every macro says there is no scaling loss."""
    Mode = mode.capitalize()
    source = f"waterfall.csv mode={mode}: 1-rank rows only; " + data.run_ids(
        "scaling", **{"config.mode": mode, "world_size": 1}
    )
    numbers.add(f"Waterfall{Mode}World", "1", source)
    for name in MACROS[1:-1]:
        numbers.add(f"Waterfall{Mode}{name}", ONE_RANK, source)
    numbers.add(
        f"Waterfall{Mode}Summary",
        f"In {mode} scaling the study ran on one {data.unit} only: with no larger point there is no"
        f" scaling loss to split (its {mode}-scaling efficiency is the reference itself).",
        source,
    )


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
    if rows["remainder_share"].isna().all():  # no point had a loss to split: the summaries say why
        numbers.add("WaterfallUnexplained", "", "waterfall.csv: no point with a loss to split")
        return
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
