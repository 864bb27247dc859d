"""The macros of the paper's energy paragraph (scalestudy.paper.numbers calls every writer in SECTIONS):
where the energy came from, joules per sample in the window at the reference and the largest
strong-scaling size (and over the whole run at the largest), the cheapest strong-scaling point to the
target accuracy in joules and in GPU-hours, Slurm's own ConsumedEnergy, and the grid's kWh
(scaling.csv, runs.csv, resource_estimate.csv; scalestudy.analysis.energy). Where nothing measured
energy every energy macro says "not measured", and \\EnergySource says why.
"""

from __future__ import annotations

import pandas as pd

from scalestudy.analysis import energy
from scalestudy.paper.macros import NOT_MEASURED, Numbers
from scalestudy.paper.sections import Data, ddp_rows, first_value, is_missing
from scalestudy.paper.tables import escape, number

MICRO = r"$\mu$"
SOURCES = {
    energy.COUNTER: "NVML's total energy counter of every GPU, read at each GPU monitor sample",
    energy.INTEGRAL: "the integral of NVML's power samples (GPUs without the energy counter)",
}


def joules(value) -> str:
    """Joules with the prefix that reads best: 3.2~kJ, 450~$\\mu$J; "not measured" where missing."""
    if is_missing(value):
        return NOT_MEASURED
    size, unit = energy.energy_unit(float(value))
    return f"{number(3)(float(value) / size)}~{unit.replace('µ', MICRO)}"


NOTHING = "nothing: energy was"  # how \\EnergySource begins where nothing measured energy


def source_text(table: pd.DataFrame | None) -> str:
    """Where the energy came from, or why it was not measured."""
    if table is None:
        return f"{NOTHING} not measured (no scaling table)"
    text = energy.sources(table)
    for prefix, words in SOURCES.items():
        if text.startswith(prefix):
            return words
    return f"{NOTHING} " + escape(text)


def energy_paragraph(numbers: Numbers, data: Data) -> None:
    table = data.table("scaling")
    strong = table[ddp_rows(table) & (table["mode"] == "strong")] if table is not None else None
    source = source_text(strong if strong is not None and len(strong) else table)
    numbers.add("EnergySource", source, "scaling.csv energy_source")
    # the template's energy sentences only where something measured energy (TeX's \iftrue/\iffalse)
    numbers.add("EnergyMeasured", r"\iffalse" if source.startswith(NOTHING) else r"\iftrue", "EnergySource")
    per_sample(numbers, data, strong)
    cheapest(numbers, data, strong)
    accounted(numbers, data)
    grid(numbers, data)


def per_sample(numbers: Numbers, data: Data, strong: pd.DataFrame | None) -> None:
    unit = escape(data.sample_unit.removesuffix("s"))
    rows = strong.sort_values("world_size") if strong is not None and len(strong) else None
    for at, column, pick in (
        ("JoulesPerSampleAtReference", "joules_per_sample_mean", 0),
        ("JoulesPerSampleAtLargest", "joules_per_sample_mean", -1),
        ("JoulesPerSampleRunAtLargest", "joules_per_sample_run_mean", -1),
    ):
        if rows is None:
            numbers.add(f"Strong{at}", NOT_MEASURED, "scaling.csv: no strong DDP rows")
            continue
        row = rows.iloc[pick]
        value = row.get(column)
        source = f"scaling.csv mode=strong world_size={int(row['world_size'])} {column}"
        numbers.add(
            f"Strong{at}", NOT_MEASURED if is_missing(value) else f"{joules(value)} per {unit}", source
        )


def cheapest(numbers: Numbers, data: Data, strong: pd.DataFrame | None) -> None:
    """The strong-scaling size that reaches the target for the fewest joules, and for the fewest GPU-hours."""
    hours = f"{data.unit}-hours".replace(" ", "-")
    for name, column, shown in (
        ("StrongCheapestEnergyPoint", "energy_to_target_j_mean", joules),
        ("StrongCheapestHoursPoint", "gpu_hours_to_target_mean", lambda v: f"{number(3)(v)}~{hours}"),
    ):
        values = (
            pd.to_numeric(strong[column], errors="coerce")
            if strong is not None and column in strong
            else None
        )
        if values is None or values.dropna().empty:
            numbers.add(name, NOT_MEASURED, f"scaling.csv mode=strong {column}: none")
            continue
        row = strong.loc[values.idxmin()]
        world = int(row["world_size"])
        units = data.unit if world == 1 else data.units
        numbers.add(
            name,
            f"{world} {units} ({shown(values.min())})",
            f"scaling.csv mode=strong world_size={world} {column} (the smallest); "
            + data.run_ids("scaling", **{"config.mode": "strong", "world_size": world}),
        )


def accounted(numbers: Numbers, data: Data) -> None:
    """Slurm's ConsumedEnergy of the training jobs, where the site accounts energy."""
    runs = data.table("runs")
    column = "sacct.energy_consumed_j"
    if runs is None or column not in runs:
        numbers.add("SacctEnergy", NOT_MEASURED + " (no Slurm accounting in runs.csv)", f"runs.csv {column}")
        return
    values = pd.to_numeric(runs[column], errors="coerce")
    if values.dropna().empty:
        why = first_value(runs, "sacct.energy_note") or first_value(runs, "sacct.note") or "no record"
        numbers.add("SacctEnergy", f"{NOT_MEASURED} ({escape(why)})", f"runs.csv {column}: empty")
        return
    numbers.add(
        "SacctEnergy",
        f"{joules(values.sum())} over {int(values.notna().sum())} of {len(runs)} jobs, "
        "as the site's energy plugin measures its nodes",
        f"runs.csv sum of {column}",
    )


def grid(numbers: Numbers, data: Data) -> None:
    table = data.table("resources")
    rows = table[table["what"] == "whole grid"] if table is not None and "kwh" in table else None
    if rows is None or rows.empty:
        numbers.add("GridEnergy", NOT_MEASURED, "resource_estimate.csv: no whole-grid kwh")
        return
    row = rows.iloc[0]
    source = str(row.get("energy_source") or "")
    value = NOT_MEASURED if is_missing(row["kwh"]) else f"{number(3)(row['kwh'])}~kWh"
    if source.startswith("assumed"):
        value += " (assumed power, not measured)"
    numbers.add("GridEnergy", value, f"resource_estimate.csv what='whole grid' kwh ({source})")


SECTIONS = (energy_paragraph,)
