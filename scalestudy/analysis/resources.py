"""Resource estimate: GPU-hours, node-hours and kWh of the configured grid and of one full training.

Three kinds of rows (column `scope`):

* `grid`: what each stage of this study cost, from the runs themselves (Slurm's elapsed time where
  sacct answered, else the trainer's total_time_s), and the total;
* `full training`: analysis.resources.full_training_epochs epochs of train_images samples at each
  measured (mode, parallelism, N), at the measured mean throughput;
* `model`: the same at analysis.resources.model_world_sizes, at the throughput the communication
  model predicts from the measured collectives (comm_bench's alpha and bandwidth) where the
  benchmark ran, else on the first configured interconnect (an estimate, not a measurement; the
  `source` column says which). The model is DDP's, so these rows are DDP's.

Throughput (the column keeps its name images_per_s) and train_images count the runs' sample_unit:
images for the ResNet, tokens for an LM, whose `what` then says so ("200 epochs of 50,000 tokens").
A study of more than one parallelism (DDP and FSDP) gets a `parallelism` column after `mode`.

`requested_gpu_hours` multiplies by overhead_factor (failures, restarts, queueing): the number a
compute-time proposal asks for.

`kwh` is the energy of the GPUs (scalestudy.analysis.energy), `energy_source` where it came from:
`grid` rows sum the runs' measured energy (energy_j; every run of the row measured, else none);
`full training` rows take the point's measured mean power in its window (all its GPUs, the mean
over repeats) times the wall time; `model` rows the measured power per GPU (the median over the
measured DDP points) times N GPUs times the wall time, an estimate. Where nothing was measured,
analysis.resources.assumed_gpu_power_w (if set) times the GPU-hours, said to be assumed; else the
column is empty and energy_source says "not measured" and why.

    python -m scalestudy.analysis.resources --runs results/tables/runs.csv \
        --scaling results/tables/scaling.csv --prediction results/tables/comm_model_prediction.csv \
        --out results/tables/resource_estimate.csv

Its LaTeX table is the paper's (scalestudy.paper.tables, results/paper/resource_estimate.tex).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import pandas as pd

from scalestudy import atomic
from scalestudy.analysis import cli, commpredict, energy, metrics, series
from scalestudy.analysis.tableio import read_csv
from scalestudy.plan.runfiles import NOT_MEASURED

log = logging.getLogger("scalestudy.analysis.resources")

COLUMNS = (
    "scope",
    "what",
    "mode",
    "world_size",
    "nodes",
    "runs",
    "epochs",
    "images_per_s",
    "wall_hours",
    "gpu_hours",
    "node_hours",
    "requested_gpu_hours",
    "source",
    "kwh",
    "energy_source",
)
JOULES_PER_KWH = 3.6e6


def _nodes(world: int, gpus_per_node: int) -> int:
    return math.ceil(world / gpus_per_node)


def grid_rows(
    runs: pd.DataFrame, gpus_per_node: int, overhead: float, assumed_w: float | None = None
) -> list[dict]:
    runs = runs.copy()
    sacct = pd.to_numeric(runs.get("sacct.elapsed_s", pd.Series(math.nan, runs.index)), errors="coerce")
    runs["hours"] = sacct.fillna(runs["total_time_s"]) / 3600.0
    source = (
        "sacct elapsed"
        if sacct.notna().all()
        else (
            "trainer total_time_s"
            if sacct.isna().all()
            else "sacct elapsed where available, else total_time_s"
        )
    )
    nodes = metrics.run_nodes(runs, gpus_per_node)
    runs["gpu_hours"] = runs["hours"] * runs["world_size"]
    runs["node_hours"] = runs["hours"] * nodes
    rows = []
    for stage, group in [*runs.groupby("stage", sort=False), ("total", runs)]:
        row = _row(
            "grid",
            f"stage {stage}" if stage != "total" else "whole grid",
            runs=len(group),
            wall_hours=group["hours"].sum(),
            gpu_hours=group["gpu_hours"].sum(),
            node_hours=group["node_hours"].sum(),
            overhead=overhead,
            source=source,
        )
        rows.append({**row, **grid_energy(group, row["gpu_hours"], assumed_w)})
    return rows


def grid_energy(group: pd.DataFrame, gpu_hours: float, assumed_w: float | None) -> dict:
    """The runs' measured energy where every one was measured; else assumed power, else not measured."""
    joules = pd.to_numeric(group.get("energy_j", pd.Series(math.nan, group.index)), errors="coerce")
    if len(group) and joules.notna().all():
        return {
            "kwh": joules.sum() / JOULES_PER_KWH,
            "energy_source": "measured: NVML (energy_j of every run)",
        }
    missing = group[joules.isna()]
    first = missing.iloc[0] if len(missing) else None
    why = _unmeasured_reason(first)
    return _assumed_or_not(
        gpu_hours, assumed_w, f"{len(missing)} of {len(group)} runs without energy ({why})"
    )


def _unmeasured_reason(row: pd.Series | None) -> str:
    if row is None:
        return "no runs"
    source, note = (row.get(key) for key in ("energy_source", "energy_note"))
    if source is None or pd.isna(source):
        return "no energy_source in runs.csv"
    return (
        str(source) if not energy.measured(pd.DataFrame({"energy_source": [source]})).iloc[0] else str(note)
    )


def _assumed_or_not(gpu_hours: float, assumed_w: float | None, why: str) -> dict:
    if assumed_w:
        return {
            "kwh": gpu_hours * assumed_w / 1000.0,
            "energy_source": f"assumed: {assumed_w:g} W per GPU "
            f"(analysis.resources.assumed_gpu_power_w; {why})",
        }
    return {"kwh": math.nan, "energy_source": f"{NOT_MEASURED}: {why}"}


def _row(
    scope,
    what,
    overhead,
    mode="",
    world=math.nan,
    nodes=math.nan,
    runs=math.nan,
    epochs=math.nan,
    images_per_s=math.nan,
    wall_hours=math.nan,
    gpu_hours=math.nan,
    node_hours=math.nan,
    source="",
    kwh=math.nan,
    energy_source="",
):
    values = (
        scope,
        what,
        mode,
        world,
        nodes,
        runs,
        epochs,
        images_per_s,
        wall_hours,
        gpu_hours,
        node_hours,
        gpu_hours * overhead,
        source,
        kwh,
        energy_source,
    )
    return dict(zip(COLUMNS, values, strict=True))


def training_row(scope, mode, world, nodes, images_per_s, settings, source, unit="images") -> dict:
    res = settings["resources"]
    wall = res["full_training_epochs"] * res["train_images"] / images_per_s / 3600.0
    what = f"{res['full_training_epochs']} epochs"
    if unit != "images":
        what += f" of {res['train_images']:,} {unit}"
    return _row(
        scope,
        what,
        res["overhead_factor"],
        mode,
        world,
        nodes,
        1,
        res["full_training_epochs"],
        images_per_s,
        wall,
        wall * world,
        wall * nodes,
        source,
    )


def full_training_rows(scaling: pd.DataFrame, settings: dict) -> list[dict]:
    """One row per measured (mode, parallelism, N), at its mean throughput."""
    gpn = settings["comm_model"]["gpus_per_node"]
    unit = series.sample_unit(scaling)
    scaling = scaling.assign(parallelism=series.parallelism_of(scaling))
    rows = []
    for _, r in scaling.sort_values(["mode", "parallelism", "world_size"], kind="stable").iterrows():
        if not r["images_per_s_mean"] > 0:
            continue
        row = training_row(
            "full training",
            r["mode"],
            int(r["world_size"]),
            _nodes(int(r["world_size"]), gpn),
            float(r["images_per_s_mean"]),
            settings,
            f"measured (mean of {int(r['repeats'])} repeat(s))",
            unit,
        )
        rows.append({**row, **point_energy(r, row, settings), "parallelism": r["parallelism"]})
    return rows


def point_energy(point: pd.Series, row: dict, settings: dict) -> dict:
    """A measured point's full training at its measured mean power (all its GPUs, in the window)."""
    power = pd.to_numeric(pd.Series([point.get("mean_power_w_mean")]), errors="coerce").iloc[0]
    if pd.notna(power) and power > 0:
        return {
            "kwh": row["wall_hours"] * power / 1000.0,
            "energy_source": f"measured power: {power:.4g} W in the window (mean of the repeats)",
        }
    why = str(point.get("energy_source") or "no energy_source in scaling.csv")
    return _assumed_or_not(row["gpu_hours"], settings["resources"]["assumed_gpu_power_w"], why)


def power_per_gpu(scaling: pd.DataFrame) -> float | None:
    """The median over the measured points of their mean window power per GPU (W)."""
    if "mean_power_w_mean" not in scaling:
        return None
    power = pd.to_numeric(scaling["mean_power_w_mean"], errors="coerce") / scaling["world_size"]
    power = power[power > 0]
    return float(power.median()) if len(power) else None


def model_curve(prediction: pd.DataFrame, settings: dict) -> tuple[str, str]:
    """(curve, source): the measured collectives' prediction if there is one, else the first
    configured interconnect's."""
    measured = [c for c in prediction["curve"].unique() if str(c).startswith(commpredict.MEASURED_CURVE)]
    if measured:
        return measured[0], f"model: {measured[0]}"
    link = settings["comm_model"]["interconnects"][0]["name"]
    return link, f"model: {link} (configured; no collective benchmark)"


def model_rows(prediction: pd.DataFrame, scaling: pd.DataFrame, settings: dict) -> list[dict]:
    """DDP at unmeasured sizes at the throughput the model (of DDP) predicts (see model_curve)."""
    if prediction.empty:
        return []
    link, source = model_curve(prediction, settings)
    gpn = settings["comm_model"]["gpus_per_node"]
    unit = series.sample_unit(scaling)
    scaling = series.ddp_only(scaling)
    per_gpu_w = power_per_gpu(scaling)
    per_sample = units_per_sample(scaling, unit)
    measured = set(zip(scaling["mode"], scaling["world_size"], strict=True))
    rows = []
    for mode, group in prediction[prediction["curve"] == link].groupby("mode"):
        batch = _global_batch_of(scaling, mode)
        for world in settings["resources"]["model_world_sizes"]:
            hit = group[group["world_size"] == world]
            if hit.empty or (mode, world) in measured or batch is None:
                continue
            images_per_s = per_sample * batch(world) / float(hit["step_s"].iloc[0])
            row = training_row("model", mode, world, _nodes(world, gpn), images_per_s, settings, source, unit)
            rows.append({**row, **model_energy(row, per_gpu_w, scaling, settings), "parallelism": series.DDP})
    return rows


def model_energy(row: dict, per_gpu_w: float | None, scaling: pd.DataFrame, settings: dict) -> dict:
    """An unmeasured size's energy: the measured power per GPU times N (an estimate), else assumed."""
    if per_gpu_w is not None:
        return {
            "kwh": row["gpu_hours"] * per_gpu_w / 1000.0,
            "energy_source": f"estimate: {per_gpu_w:.4g} W per GPU measured (median over the points) x N",
        }
    why = energy.sources(scaling) if len(scaling) else "no measured point"
    return _assumed_or_not(row["gpu_hours"], settings["resources"]["assumed_gpu_power_w"], why)


def units_per_sample(scaling: pd.DataFrame, unit: str) -> float:
    """What one batch element counts in the throughput's unit: 1 for images; for an LM the tokens of a
    sequence, measured as rate per rank x step time / per-rank batch (the median over the rows)."""
    if unit == "images":
        return 1.0
    ratio = scaling["images_per_s_per_gpu_mean"] * scaling["time_per_step_s_mean"] / scaling["per_gpu_batch"]
    return float(ratio.median())


def _global_batch_of(scaling: pd.DataFrame, mode: str):
    rows = scaling[scaling["mode"] == mode]
    if rows.empty:
        return None
    if mode == "strong":
        return lambda n, g=float(rows["global_batch"].iloc[0]): g
    return lambda n, b=float(rows["per_gpu_batch"].iloc[0]): b * n


def estimate(
    runs: pd.DataFrame, scaling: pd.DataFrame, prediction: pd.DataFrame, settings: dict
) -> pd.DataFrame:
    res = settings["resources"]
    rows = [
        *grid_rows(
            runs, settings["comm_model"]["gpus_per_node"], res["overhead_factor"], res["assumed_gpu_power_w"]
        ),
        *full_training_rows(scaling, settings),
        *model_rows(prediction, scaling, settings),
    ]
    table = pd.DataFrame(rows, columns=list(COLUMNS))
    table = table.astype({"world_size": "Int64", "nodes": "Int64", "runs": "Int64", "epochs": "Int64"})
    parallelism = pd.Series([row.get("parallelism") or "" for row in rows], index=table.index)
    if parallelism[parallelism != ""].nunique() > 1:
        table.insert(table.columns.get_loc("mode") + 1, "parallelism", parallelism)
    return table


def main(argv: Sequence[str] | None = None) -> int:
    parser = cli.parser(__doc__.splitlines()[0])
    parser.add_argument("--runs", required=True, help="The run catalog (runs.csv).")
    parser.add_argument("--scaling", required=True, help="scaling.csv (analysis.metrics).")
    parser.add_argument("--prediction", required=True, help="comm_model_prediction.csv (analysis.commmodel).")
    parser.add_argument("--out", required=True, help="Resource estimate CSV to write.")
    args = parser.parse_args(argv)
    settings = cli.start(args)
    runs = read_csv(args.runs, ["stage", "world_size", "total_time_s"])
    scaling = read_csv(args.scaling, ["mode", "world_size", "images_per_s_mean", "repeats"])
    prediction = read_csv(args.prediction, ["mode", "curve", "world_size", "step_s"])
    table = estimate(runs, scaling, prediction, settings)
    atomic.write_csv(args.out, table)
    log.info("resource estimate: %d rows -> %s", len(table), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
