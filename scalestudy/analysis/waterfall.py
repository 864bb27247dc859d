"""The scaling-loss waterfall: for every scaling point, where the lost efficiency went.

Unit: seconds per step, and the same seconds as points of efficiency. Every measured part is time a
rank spends per optimizer step (waiting for data, for the host, for the slowest rank, for the
all-reduce), and times within one step add; a loss of throughput is a loss of step time too.
Dividing every term by the point's measured step time T turns it into points of efficiency (100 (1
- E) in all), which add up for the same reason. The table holds both; figure and paper use points.

Per scaling run at N ranks of a series (mode, parallelism), with T its measured time per step
(scalestudy.analysis.metrics.time_per_step) and E its efficiency against the mean throughput X(1)
of the series' 1-GPU runs (metrics: E = X(N) / (N X(1))):

    ideal step time   T_ideal = E T = global batch / (N X(1))   (weak: T(1); strong: T(1) / N)
    loss              L = T - T_ideal = T (1 - E)               seconds per step
    points lost       100 (1 - E) = 100 L / T

The 1-GPU step holds its own data wait and host overhead, and the ideal keeps them at the scale s
it gives T(1) (weak scaling s = 1, the same per-GPU batch; strong s = 1/N, 1/N of it). So a part is
what the point spends beyond that share of the reference's (p(1): the mean over the 1-GPU runs):

    exposed communication   c(N)                the all-reduce not hidden behind the backward pass
    data-loader wait        d(N) - s d(1)       d: the median rank's wait for the next batch
    host and launch         h(N) - s h(1)       h: the median rank's step time minus its device span
    straggler wait          g(N)                g: the slowest rank's own step time over the median
                                                   rank's (own: its step time minus its gradient wait)
    remainder               R = L - (c + d + h + g)

d, h and g come from the run's `step_parts` (scalestudy.train.step_parts: every rank's measurement
window, gathered; where they are measured and what they cannot see is said there). c is the
profile's exposed communication per step where that world size was profiled (results/profile/
overlap.csv: the mean over ranks of exposed_communication_s / steps), elsewhere the ring all-reduce
of scalestudy.analysis.commmodel, 2(N-1)/N S/B + 2(N-1) k alpha, with the collective benchmark's
measured alpha and bus bandwidth B (the configured link where it did not run), times (1 - phi):
phi the overlap the profile measured (overlapped over communication time of its multi-GPU rows),
else the communication model's (comm_model_fit.csv's overlap_fraction, derived or assumed as its
note says). The model is DDP's: an FSDP point's c is not measured.

What a run paid once before its first step ended, its start-up and torch.compile's seconds of
it (outside the measurement window: a compiled point's compile, or its artifacts' load), sits
beside the per-step terms as `fixed_cost_s` and `compile_s` (means over the repeats), never in the
loss. A part that was not measured is empty, with the reason in its `_how` column (host overhead on the
CPU: no device timeline; a run without step_parts), never a zero: the remainder holds it. So a
run's parts and remainder add up to its loss exactly (up to floating point); a row is the mean over
the point's repeats of each run's loss and parts (a part some repeat lacks is not measured at the
point) and its remainder the mean loss less the mean parts, so a row adds up too. The remainder's
share of the loss is reported (negative where the parts over-explain it); `unexplained_flagged`
marks a row whose share exceeds analysis.waterfall.unexplained_share_max in size, and the paper
says so. A point with no loss is not split (its remainder empty, its note saying why): one whose
efficiency is at the ideal, and one above it, to check: a measurement problem or a superlinear gain
(scalestudy.analysis.above_ideal: `efficiency_above_ideal`), never drawn as parts against a negative
loss. A series with no N > 1 point (a one-GPU study) gets one row per 1-rank run saying that one
rank has no scaling loss to split, rather than an empty table. `runs` names the row's runs and
its 1-rank reference's (runs.csv's stage/point), where their provenance is.

Example (weak scaling, N = 8, T(1) = 100 ms, T(8) = 139 ms: E = 72 %, L = 39 ms = 28 points): c =
26.4 ms (19 points), d(8) - d(1) = 2.8 ms (2 points), h(8) - h(1) = 1.4 ms (1 point), g = 5.6 ms
(4 points), R = 39 - 36.2 = 2.8 ms (2 points, 7 % of the loss).

    python -m scalestudy.analysis.waterfall --runs results/tables/runs.csv \
        [--comm-fit results/tables/comm_model_fit.csv] [--bench-fit results/tables/comm_bench_fit.csv] \
        [--profile-overlap results/profile/overlap.csv] [--analysis-json JSON | --config FILE] \
        --out results/tables/waterfall.csv
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from scalestudy import atomic
from scalestudy.analysis import above_ideal, cli, commmodel, commpredict, metrics, modelsize, series
from scalestudy.analysis.tableio import read_csv
from scalestudy.plan import runconfig
from scalestudy.plan.runfiles import NOT_MEASURED

log = logging.getLogger("scalestudy.analysis.waterfall")

PARTS = {
    "exposed_comm": "exposed communication",
    "data_wait": "data-loader wait",
    "host_overhead": "host and launch overhead",
    "straggler": "straggler wait",
}
REMAINDER = "remainder"
TERMS = (*PARTS, REMAINDER)
STEP_PARTS = "step_parts."  # runs.csv's columns of summary.json's step_parts (JSON lists, rank order)
NO_PARTS = f"{NOT_MEASURED}: the run reports no step_parts (a summary before them, or a command workload)"
NO_DEVICE_TIMELINE = f"{NOT_MEASURED} on the CPU: no device timeline"
NO_HOOK = f"{NOT_MEASURED}: no gradient hook (FSDP2's sharded parameters)"
NOT_MODELLED = f"{NOT_MEASURED}: the communication model covers DDP's all-reduce only"
NO_REFERENCE = f"{NOT_MEASURED} at the 1-GPU reference"
NO_LOSS = "no loss to explain (at the ideal)"
NOT_SPLIT = "not split: there is no loss to split"
ONE_RANK = (
    "one rank only: no scaling loss to split (the waterfall splits what N > 1 ranks lose against the "
    "1-rank reference; this series has no N > 1 point)"
)
NOT_SCALED = f"{NOT_MEASURED}: one rank, no scaling loss"
OVERLAP_COLUMNS = ("world_size", "tool", "communication_s", "overlap_s", "exposed_communication_s", "steps")
NUMERIC = (
    "step_time_s",
    "ideal_step_time_s",
    "efficiency",
    "loss_s",
    "loss_points",
    *(f"{part}_{unit}" for part in PARTS for unit in ("s", "points")),
)
# What a run paid once, before its first step ended (outside the measurement window, so never a term
# of the per-step loss): its start-up (summary.json startup_s) and, of it, torch.compile's seconds.
FIXED = {"fixed_cost_s": "startup_s", "compile_s": "compile_s"}
COLUMNS = (
    "mode",
    "parallelism",
    "world_size",
    "repeats",
    "per_gpu_batch",
    "global_batch",
    *NUMERIC,
    *FIXED,
    "remainder_s",
    "remainder_points",
    "remainder_share",
    "unexplained_flagged",
    "unexplained_share_max",
    above_ideal.COLUMN,
    *(f"{part}_how" for part in PARTS),
    "sample_unit",
    "runs",
    "note",
)


# --- the parts each run measured (step_parts) ---------------------------------------------------------


def rank_values(runs: pd.DataFrame, key: str) -> pd.Series:
    """Each run's step_parts.<key> (rank order) as a float array, or None where it has none."""
    column = STEP_PARTS + key
    if column not in runs:
        return pd.Series([None] * len(runs), index=runs.index, dtype=object)
    return runs[column].map(_as_array)


def _as_array(cell) -> np.ndarray | None:
    if isinstance(cell, str) and cell.strip():
        cell = json.loads(cell)
    return np.asarray(cell, dtype=float) if isinstance(cell, list) else None


def run_parts(runs: pd.DataFrame) -> pd.DataFrame:
    """Per run the measured d, h, g (seconds per step; NaN where not measured) and how (`_how`)."""
    step = rank_values(runs, "step_s")
    data = rank_values(runs, "data_wait_s")
    device = rank_values(runs, "device_busy_s")
    gradient = rank_values(runs, "gradient_wait_s")
    devices = runs["device"].astype(str) if "device" in runs else pd.Series("", index=runs.index)
    rows = {}
    for index in runs.index:
        measured = {
            "data_wait": _data_wait(data[index]),
            "host_overhead": _host_overhead(step[index], device[index], devices[index]),
            "straggler": _straggler(step[index], gradient[index]),
        }
        rows[index] = {
            f"{part}_{key}": v for part, (s, how) in measured.items() for key, v in (("s", s), ("how", how))
        }
    return pd.DataFrame.from_dict(rows, orient="index").reindex(runs.index)


def _data_wait(data) -> tuple[float, str]:
    if data is None:
        return math.nan, NO_PARTS
    return float(np.median(data)), "median over ranks of the wait for the next batch"


def _host_overhead(step, device, device_type: str) -> tuple[float, str]:
    if step is not None and device is not None:
        return float(
            np.median(step - device)
        ), "median over ranks of step time minus device span (CUDA events)"
    if device_type == "cpu":
        return math.nan, NO_DEVICE_TIMELINE
    return math.nan, NO_PARTS


def _straggler(step, gradient) -> tuple[float, str]:
    if step is None:
        return math.nan, NO_PARTS
    if gradient is None:
        return math.nan, NO_HOOK
    own = step - gradient  # each rank's step less its wait after its last gradient
    return float(own.max() - np.median(own)), "slowest rank's own step time over the median rank's"


# --- exposed communication ----------------------------------------------------------------------------


def profiled_exposed(overlap: pd.DataFrame | None) -> dict[int, tuple[float, str]]:
    """{world size > 1: (exposed communication per step, how)} of the profiled world sizes."""
    if overlap is None or overlap.empty:
        return {}
    out = {}
    for world, rows in overlap.groupby("world_size"):
        if int(world) > 1:
            steps = rows["steps"].astype(float).clip(lower=1)
            tools = ", ".join(sorted(map(str, rows["tool"].unique())))
            value = float((rows["exposed_communication_s"] / steps).mean())
            out[int(world)] = (
                value,
                f"profile at N={int(world)} ({tools}): exposed communication, mean over ranks",
            )
    return out


def measured_overlap(
    overlap: pd.DataFrame | None, comm_fit: pd.DataFrame | None, model: dict
) -> tuple[float, str]:
    """phi: the profile's (overlapped over communication time of its multi-GPU rows), else the
    communication model's (derived or assumed), else the configured overlap_fraction."""
    if overlap is not None and not overlap.empty:
        multi = overlap[overlap["world_size"].astype(int) > 1]
        communication = multi["communication_s"].astype(float).sum()
        if communication > 0:
            return float(
                multi["overlap_s"].astype(float).sum() / communication
            ), "overlap measured by the profile"
    fitted = comm_fit[comm_fit["quantity"] == "overlap_fraction"] if comm_fit is not None else pd.DataFrame()
    if not fitted.empty and pd.notna(pd.to_numeric(fitted["value"].iloc[0], errors="coerce")):
        return float(fitted["value"].iloc[0]), f"the communication model's overlap ({fitted['note'].iloc[0]})"
    return float(model["overlap_fraction"]), "overlap assumed (analysis.comm_model.overlap_fraction)"


class ExposedComm:
    """c(N) of a DDP run: the profile's where its world size was profiled, else the ring model."""

    def __init__(self, settings: dict, comm_fit=None, bench_fit=None, overlap=None) -> None:
        self.model = settings["comm_model"]
        self.profiled = profiled_exposed(overlap)
        self.links = commpredict.measured_links(bench_fit)
        self.phi, self.phi_how = measured_overlap(overlap, comm_fit, self.model)

    def of(self, runs: pd.DataFrame, index) -> tuple[float, str]:
        world = int(runs.at[index, "world_size"])
        if world in self.profiled:
            return self.profiled[world]
        grad = commmodel.gradient_bytes(runs.loc[[index]])[0]
        bucket_mb = pd.to_numeric(runs.at[index, "config.bucket_cap_mb"], errors="coerce")
        buckets = modelsize.bucket_count(
            grad, runconfig.DEFAULTS["bucket_cap_mb"] if pd.isna(bucket_mb) else bucket_mb
        )
        alpha, beta, where = self.link(world)
        raw = float(commpredict.ring_allreduce_s(world, grad, buckets, alpha, beta))
        return (
            1.0 - self.phi
        ) * raw, f"ring all-reduce model ({where}) x (1 - {self.phi:.3g}), {self.phi_how}"

    def link(self, world: int) -> tuple[float, float, str]:
        """(alpha per ring step, seconds per byte, where they come from) for a ring of `world`."""
        if self.links:
            link = commpredict.link_of(self.links, world, self.model["gpus_per_node"])
            beta = 1.0 / (float(link["bandwidth_gb_s"]) * commpredict.GB)
            return float(link["link_alpha_s"]), beta, f"comm_bench {link['placement']} alpha and bandwidth"
        inside = world <= self.model["gpus_per_node"]
        link = self.model["intra_node"] if inside else self.model["interconnects"][0]
        beta = 1.0 / (link["bandwidth_gb_s"] * commpredict.GB)
        return link["alpha_us"] * commpredict.US, beta, f"configured link {link['name']}"


# --- the waterfall ------------------------------------------------------------------------------------


def run_terms(runs: pd.DataFrame, settings: dict, comm: ExposedComm) -> pd.DataFrame:
    """Per multi-GPU scaling run: its loss and parts, in seconds and points (see the module doc)."""
    scaling = metrics.run_metrics(runs, settings)
    scaling = scaling[scaling["stage"] == "scaling"].copy()
    scaling["parallelism"] = series.parallelism_of(scaling)
    scaling = scaling.join(run_parts(scaling))
    rows = []
    for (mode, parallelism), group in scaling.groupby(["config.mode", "parallelism"], sort=True):
        reference = group[group["world_size"] == 1]
        if reference.empty or group["efficiency"].isna().all():
            log.warning(
                "waterfall: scaling %s (%s) has no 1-GPU run: no ideal to lose against", mode, parallelism
            )
            continue
        base = {part: reference[f"{part}_s"].mean(skipna=False) for part in ("data_wait", "host_overhead")}
        base["runs"] = run_ids(reference)
        for index in group.index[group["world_size"] > 1]:
            exposed = comm.of(scaling, index) if parallelism == series.DDP else (math.nan, NOT_MODELLED)
            rows.append(_run_row(scaling.loc[index], mode, parallelism, base, exposed))
        if not (group["world_size"] > 1).any():
            rows += [_one_rank_row(reference.loc[index], mode, parallelism) for index in reference.index]
    return pd.DataFrame(rows)


def _one_rank_row(run: pd.Series, mode: str, parallelism: str) -> dict:
    """A 1-rank run of a series with no N > 1 point: its step time, no loss and no parts (ONE_RANK)."""
    step = float(run["time_per_step_s"])
    row = {
        "mode": mode,
        "parallelism": parallelism,
        "world_size": 1,
        "per_gpu_batch": run["per_gpu_batch"],
        "global_batch": run["global_batch"],
        "step_time_s": step,
        "ideal_step_time_s": step,
        "efficiency": float(run["efficiency"]),
        "loss_s": 0.0,
        "loss_points": 0.0,
        "sample_unit": run["sample_unit"],
        "run": f"{run['stage']}/{run['point']}",
        "reference_runs": "",
        "note": run["note"],
        **fixed_costs(run),
    }
    for part in PARTS:
        row |= {f"{part}_s": math.nan, f"{part}_points": math.nan, f"{part}_how": NOT_SCALED}
    return row


def fixed_costs(run: pd.Series) -> dict:
    """The run's one-off seconds (FIXED; NaN where its summary has none: eager, or older)."""
    return {column: pd.to_numeric(run.get(source), errors="coerce") for column, source in FIXED.items()}


def run_ids(runs: pd.DataFrame) -> str:
    """The runs' ids in runs.csv (stage/point), the provenance of a row made of them."""
    return ", ".join(f"{stage}/{point}" for stage, point in zip(runs["stage"], runs["point"], strict=True))


def _run_row(run: pd.Series, mode: str, parallelism: str, base: dict, exposed: tuple[float, str]) -> dict:
    step = float(run["time_per_step_s"])
    loss = step * (1.0 - float(run["efficiency"]))
    scale = 1.0 / float(run["world_size"]) if mode == "strong" else 1.0
    row = {
        "mode": mode,
        "parallelism": parallelism,
        "world_size": int(run["world_size"]),
        "per_gpu_batch": run["per_gpu_batch"],
        "global_batch": run["global_batch"],
        "step_time_s": step,
        "ideal_step_time_s": step - loss,
        "efficiency": float(run["efficiency"]),
        "loss_s": loss,
        "exposed_comm_s": exposed[0],
        "exposed_comm_how": exposed[1],
        "straggler_s": run["straggler_s"],
        "straggler_how": run["straggler_how"],
        "sample_unit": run["sample_unit"],
        "run": f"{run['stage']}/{run['point']}",
        "reference_runs": base["runs"],
        "note": run["note"],
        **fixed_costs(run),
    }
    for part in ("data_wait", "host_overhead"):
        row[f"{part}_s"] = run[f"{part}_s"] - scale * base[part]
        missing_base = pd.isna(base[part]) and pd.notna(run[f"{part}_s"])
        row[f"{part}_how"] = NO_REFERENCE if missing_base else run[f"{part}_how"]
    for term in ("loss", *PARTS):
        row[f"{term}_points"] = 100.0 * row[f"{term}_s"] / step
    return row


def waterfall_table(terms: pd.DataFrame, share_max: float) -> pd.DataFrame:
    """One row per (mode, parallelism, world size): the mean over repeats of each run's loss and
    parts (a part some repeat lacks is not measured at the point); the remainder is the loss less
    the measured parts, in seconds and points."""
    if terms.empty:
        return pd.DataFrame(columns=list(COLUMNS))
    rows = []
    for (mode, parallelism, world), group in terms.groupby(["mode", "parallelism", "world_size"], sort=True):
        row = {"mode": mode, "parallelism": parallelism, "world_size": int(world), "repeats": len(group)}
        row |= {column: group[column].iloc[0] for column in ("per_gpu_batch", "global_batch", "sample_unit")}
        row |= {column: group[column].mean(skipna=False) for column in NUMERIC}
        row |= {column: group[column].mean() for column in FIXED}
        row |= {f"{part}_how": "; ".join(dict.fromkeys(group[f"{part}_how"])) for part in PARTS}
        notes = [*dict.fromkeys(note for note in group["note"].fillna("").astype(str) if note)]
        reference = group["reference_runs"].iloc[0]
        row["runs"] = ", ".join(group["run"]) + (f"; 1-rank reference: {reference}" if reference else "")
        row[above_ideal.COLUMN] = above_ideal.above(row["efficiency"])
        rows.append(row | {"unexplained_share_max": share_max} | _remainder(row, notes, share_max))
    return pd.DataFrame(rows)[list(COLUMNS)]


def _remainder(row: dict, notes: list[str], share_max: float) -> dict:
    """The remainder (seconds, points, share of the loss), whether it is flagged, and the row's note.
    A point with no loss (a 1-rank series, an efficiency at or above the ideal) is not split: its
    remainder is empty, and the note says why."""
    if int(row["world_size"]) == 1:
        why = ONE_RANK
    elif row[above_ideal.COLUMN]:
        why = f"{above_ideal.NOTE}; {NOT_SPLIT}"
    elif not row["loss_s"] > 0:
        why = NO_LOSS
    else:
        out = {}
        for unit in ("s", "points"):
            out[f"remainder_{unit}"] = row[f"loss_{unit}"] - sum(
                row[f"{part}_{unit}"] for part in PARTS if pd.notna(row[f"{part}_{unit}"])
            )
        share = out["remainder_s"] / row["loss_s"]
        flagged = bool(abs(share) > share_max)
        return out | {"remainder_share": share, "unexplained_flagged": flagged, "note": "; ".join(notes)}
    empty = {"remainder_s": math.nan, "remainder_points": math.nan, "remainder_share": math.nan}
    return empty | {"unexplained_flagged": False, "note": "; ".join([*notes, why])}


def analyse(
    runs: pd.DataFrame,
    settings: dict,
    comm_fit: pd.DataFrame | None = None,
    bench_fit: pd.DataFrame | None = None,
    overlap: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """The waterfall table (COLUMNS) from the run catalog and the optional communication tables."""
    terms = run_terms(runs, settings, ExposedComm(settings, comm_fit, bench_fit, overlap))
    table = waterfall_table(terms, settings["waterfall"]["unexplained_share_max"])
    for _, row in table[table["unexplained_flagged"]].iterrows():
        log.warning(
            "waterfall: %s N=%d: the remainder is %.0f %% of the loss (%s)",
            row["mode"],
            row["world_size"],
            100 * row["remainder_share"],
            "unexplained" if row["remainder_share"] > 0 else "over-explained",
        )
    return table


def main(argv: Sequence[str] | None = None) -> int:
    parser = cli.parser(__doc__.splitlines()[0])
    parser.add_argument("--runs", required=True, help="The run catalog (runs.csv).")
    parser.add_argument("--comm-fit", help="comm_model_fit.csv (its overlap_fraction), optional.")
    parser.add_argument("--bench-fit", help="comm_bench_fit.csv (measured alpha and bandwidth), optional.")
    parser.add_argument("--profile-overlap", help="results/profile/overlap.csv, optional.")
    parser.add_argument("--out", required=True, help="waterfall.csv to write.")
    args = parser.parse_args(argv)
    settings = cli.start(args)
    comm_fit = read_csv(args.comm_fit, ["quantity", "value", "note"]) if args.comm_fit else None
    bench = read_csv(args.bench_fit, commmodel.BENCH_FIT_COLUMNS) if args.bench_fit else None
    overlap = read_csv(args.profile_overlap, OVERLAP_COLUMNS) if args.profile_overlap else None
    table = analyse(read_csv(args.runs), settings, comm_fit, bench, overlap)
    atomic.write_csv(args.out, table)
    log.info("waterfall: %d points -> %s", len(table), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
