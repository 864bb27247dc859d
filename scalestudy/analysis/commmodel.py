"""An alpha-beta model of DDP's ring all-reduce, fitted to the measured step times.

Per step, a run on N GPUs with per-GPU batch b takes T(N, b) = c b + beta_eff * 2(N-1)/N * S +
alpha_eff * 2(N-1) k: c the compute time per sample (from the 1-GPU runs), S the gradient bytes, k
the all-reduce calls (buckets), alpha_eff and beta_eff the latency and inverse bus bandwidth left
exposed by overlap. `fit` is least squares on the excess T - c b of the multi-GPU DDP scaling runs
(FSDP runs are counted, not modelled), with alpha fixed where the data cannot tell it apart;
`predict` (scalestudy.analysis.commpredict) extends it to each configured interconnect, and the
collective benchmark's measured alpha and bus bandwidth give one more curve. The model, the fit's
cases and what it cannot say: docs/reference/methods.md, "The communication model".

    python -m scalestudy.analysis.commmodel --runs results/tables/runs.csv \
        --fit-out results/tables/comm_model_fit.csv --residuals-out results/tables/comm_model_residuals.csv \
        --prediction-out results/tables/comm_model_prediction.csv [--bench-fit comm_bench_fit.csv] \
        [--profile-overlap results/profile/overlap.csv] [--analysis-json JSON | --config FILE]
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from scalestudy import atomic
from scalestudy.analysis import cli, contention, metrics, mfu, modelsize, series
from scalestudy.analysis.commpredict import (
    GB,
    PREDICTION_COLUMNS,
    US,
    Fit,
    bench_rows,
    link_of,
    measured_links,
    predict,
)
from scalestudy.analysis.tableio import read_csv, require_columns

log = logging.getLogger("scalestudy.analysis.commmodel")

RESIDUAL_COLUMNS = (
    "mode",
    "world_size",
    "per_gpu_batch",
    "grad_bytes",
    "buckets",
    "step_s",
    "compute_s",
    "excess_s",
    "predicted_step_s",
    "residual_s",
)
BENCH_FIT_COLUMNS = ("collective", "world_size", "nodes", "placement", "link_alpha_s", "bandwidth_gb_s", "r2")
OVERLAP_COLUMNS = ("world_size", "tool", "communication_s", "exposed_communication_s", "steps")


def design(points: pd.DataFrame) -> np.ndarray:
    """Columns multiplying (beta_eff, alpha_eff) in the excess step time."""
    n = points["world_size"].to_numpy(float)
    return np.column_stack(
        [
            2.0 * (n - 1.0) / n * points["grad_bytes"].to_numpy(float),
            2.0 * (n - 1.0) * points["buckets"].to_numpy(float),
        ]
    )


def fit_points(runs: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, float]]:
    """DDP scaling runs as fit points (step time, gradient bytes, buckets) and c per mode."""
    require_columns(
        runs,
        [
            "stage",
            "config.mode",
            "world_size",
            "per_gpu_batch",
            "images_per_s_per_gpu",
            "config.bucket_cap_mb",
        ],
        "runs",
    )
    scaling = series.ddp_only(runs[runs["stage"] == "scaling"])
    scaling = _with_known_size(scaling[~contention.contended(scaling)])  # shared GPUs: not the model's
    grad = gradient_bytes(scaling)
    points = pd.DataFrame(
        {
            "mode": scaling["config.mode"].to_numpy(),
            "world_size": scaling["world_size"].astype(int).to_numpy(),
            "per_gpu_batch": scaling["per_gpu_batch"].to_numpy(float),
            "grad_bytes": grad,
            "buckets": [
                modelsize.bucket_count(g, b)
                for g, b in zip(grad, scaling["config.bucket_cap_mb"], strict=True)
            ],
            "step_s": step_seconds(scaling),
        }
    )
    single = points[points["world_size"] == 1]
    compute = {mode: float((g["step_s"] / g["per_gpu_batch"]).mean()) for mode, g in single.groupby("mode")}
    points = points[points["mode"].isin(compute)].copy()
    points["compute_s"] = points["mode"].map(compute) * points["per_gpu_batch"]
    points["excess_s"] = points["step_s"] - points["compute_s"]
    return points.reset_index(drop=True), compute


def _with_known_size(scaling: pd.DataFrame) -> pd.DataFrame:
    """The runs whose gradient bytes are known (a user's script that reports no parameter count,
    scalestudy.contract's "model" line, cannot be modelled): the others are named and
    left out."""
    known = pd.Series(
        [count is not None for count in parameter_counts(scaling)], index=scaling.index, dtype=bool
    )
    if not known.all():
        points = scaling.loc[~known, "point"] if "point" in scaling else scaling.index[~known]
        log.warning(
            "communication model: %d scaling run(s) report no parameter count, left out: %s",
            (~known).sum(),
            ", ".join(map(str, points)),
        )
    return scaling[known]


def parameter_counts(runs: pd.DataFrame) -> list[int | None]:
    """Each run's parameters: its own count (any workload), else its workload's closed form
    (mfu.closed_form: the ResNet's of its width, for a catalog without counts); None: unknown."""
    counted = _numeric(runs, "parameters")
    found: list[int | None] = []
    for index, r in runs.iterrows():
        if pd.notna(counted[index]):
            found.append(int(counted[index]))
        else:
            size = mfu.closed_form(r)
            found.append(None if size is None else int(size[0]))
    return found


def gradient_bytes(runs: pd.DataFrame) -> list[float]:
    """Bytes each run's all-reduce moves per step: from its parameters (parameter_counts); fp32 or
    16-bit (comm hook)."""
    hooks = runs["config.comm_hook"] if "config.comm_hook" in runs else pd.Series("none", runs.index)
    grad = []
    for (index, hook), parameters in zip(hooks.items(), parameter_counts(runs), strict=True):
        if parameters is None:
            point = runs["point"][index] if "point" in runs else index
            raise ValueError(
                f"runs: scaling run {point} has neither parameters nor a closed form of its model: its "
                "gradient bytes are unknown"
            )
        grad.append(modelsize.gradient_bytes_of(parameters, str(hook)))
    return grad


def _numeric(runs: pd.DataFrame, column: str) -> pd.Series:
    if column not in runs:
        return pd.Series(math.nan, index=runs.index)
    return pd.to_numeric(runs[column], errors="coerce")


def step_seconds(runs: pd.DataFrame) -> np.ndarray:
    """Seconds per training step (metrics.time_per_step: per-GPU batch / per-GPU rate where the rate
    counts images, else the trainer's own step time)."""
    frame = runs.assign(sample_unit=series.unit_of(runs), window_filled=metrics.window_filled(runs))
    return metrics.time_per_step(frame).to_numpy(float)


def fit(points: pd.DataFrame, compute: dict[str, float], fixed_alpha_s: float) -> Fit:
    """Least-squares alpha_eff, beta_eff from the multi-GPU points (see the module doc)."""
    multi = points[points["world_size"] > 1].reset_index(drop=True)
    if multi.empty:
        return Fit(
            "not fitted: no multi-GPU run with a 1-GPU reference",
            math.nan,
            math.nan,
            0,
            0,
            compute_s_per_image=compute,
        )
    x, y = design(multi), multi["excess_s"].to_numpy(float)
    identifiable = np.linalg.matrix_rank(x / np.abs(x).max(axis=0)) == 2
    if identifiable and len(multi) >= 3:
        result = _fit_free(x, y)
    else:
        why = "one world size > 1" if not identifiable else f"{len(multi)} points leave no degree of freedom"
        result = _fit_fixed_alpha(
            x, y, fixed_alpha_s, f"alpha fixed at {fixed_alpha_s / US:g} us from config ({why})"
        )
    result.compute_s_per_image = compute
    predicted = multi["compute_s"] + x @ np.array([result.beta_s_per_byte, result.alpha_s])
    result.residuals = multi.assign(predicted_step_s=predicted, residual_s=multi["step_s"] - predicted)
    if result.dof == 0:
        result.method += "; dof 0: the fit is exact by construction, residuals say nothing"
    return result


def _fit_free(x: np.ndarray, y: np.ndarray) -> Fit:
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    method = "free (alpha and beta fitted)"
    if coef.min() < 0:
        clipped = int(np.argmin(coef))
        keep = 1 - clipped
        only, *_ = np.linalg.lstsq(x[:, [keep]], y, rcond=None)
        coef = np.zeros(2)
        coef[keep] = max(float(only[0]), 0.0)
        method = f"free, {('beta', 'alpha')[clipped]} clipped to 0 (negative estimate)"
        return _finish(method, x[:, [keep]], y, coef, dof=len(y) - 1, se_index=keep)
    return _finish(method, x, y, coef, dof=len(y) - 2)


def _fit_fixed_alpha(x: np.ndarray, y: np.ndarray, alpha_s: float, method: str) -> Fit:
    rest = y - x[:, 1] * alpha_s
    beta = float(np.dot(x[:, 0], rest) / np.dot(x[:, 0], x[:, 0]))
    if beta < 0:
        beta, method = 0.0, method + "; beta clipped to 0 (negative estimate)"
    return _finish(method, x[:, [0]], rest, np.array([beta, alpha_s]), dof=len(y) - 1, se_index=0)


def _finish(method, x_used, y_used, coef, dof, se_index=None) -> Fit:
    """Residual RMS and standard errors (sigma^2 (X'X)^-1) of the fitted coefficients."""
    coef_used = coef if x_used.shape[1] == 2 else coef[[se_index]]
    residual = y_used - x_used @ coef_used
    rms = float(np.sqrt(np.mean(residual**2)))
    se = np.full(2, math.nan)
    if dof > 0:
        sigma2 = float(residual @ residual) / dof
        diag = np.sqrt(np.diag(sigma2 * np.linalg.pinv(x_used.T @ x_used)))
        se[[0, 1] if x_used.shape[1] == 2 else [se_index]] = diag
    return Fit(method, float(coef[1]), float(coef[0]), len(y_used), dof, rms, se[1], se[0])


def overlap(fit_result: Fit, model: dict) -> tuple[float, str]:
    """phi: derived from beta_eff and the measured bandwidth when configured, else assumed."""
    measured = model["measured_bandwidth_gb_s"]
    if measured is None or not math.isfinite(fit_result.beta_s_per_byte):
        return float(model["overlap_fraction"]), "assumed (analysis.comm_model.overlap_fraction)"
    phi = 1.0 - fit_result.beta_s_per_byte * measured * GB
    clipped = min(max(phi, 0.0), 1.0)
    note = f"derived: 1 - beta_eff x {measured:g} GB/s"
    return clipped, note + (f" (= {phi:.3g}, clipped)" if clipped != phi else "")


def fit_table(f: Fit, phi: float, phi_note: str, runs: pd.DataFrame | None = None) -> pd.DataFrame:
    """The fit's quantities; with the run catalog, also the rows its workload and FSDP runs need
    (a ResNet-18 DDP study's table has none of them)."""
    runs = runs if runs is not None else pd.DataFrame(columns=["stage"])
    rows = [
        ("method", f.method, "", ""),
        ("points", f.n_points, "", "multi-GPU scaling runs in the fit"),
        *excluded_rows(runs),
        ("degrees_of_freedom", f.dof, "", ""),
        ("alpha_eff", f.alpha_s / US, "us", _se(f.alpha_se_s / US)),
        ("bandwidth_eff", f.bandwidth_gb_s, "GB/s", "1 / beta_eff; " + _se(f.bandwidth_se_gb_s)),
        ("rms_residual", f.rms_residual_s * 1e3, "ms", "per step"),
        ("overlap_fraction", phi, "", phi_note),
    ]
    quantity, note = _compute_words(runs)
    rows += [(f"{quantity}[{m}]", c * 1e3, "ms", note) for m, c in f.compute_s_per_image.items()]
    return pd.DataFrame(rows, columns=["quantity", "value", "unit", "note"])


CONTENDED_NOTE = "contended scaling runs (a foreign process on their GPUs) are not in the fit"


def excluded_rows(runs: pd.DataFrame) -> list[tuple]:
    """Rows counting the scaling runs left out of fit and predictions: contended ones, and those of
    another parallelism (FSDP)."""
    scaling = runs[runs["stage"] == "scaling"]
    other = scaling[series.parallelism_of(scaling) != series.DDP]
    shared = scaling[contention.contended(scaling)]
    rows = [] if shared.empty else [("runs_contended", len(shared), "", CONTENDED_NOTE)]
    if other.empty:
        return rows
    kinds = ", ".join(sorted(series.parallelism_of(other).unique()))
    note = (
        f"{kinds} scaling runs are not in the fit or the predictions: the model covers DDP's gradient "
        "all-reduce only (FSDP's per-unit all-gather + reduce-scatter are not modelled)"
    )
    return [*rows, ("runs_not_modelled", len(other), "", note)]


def _compute_words(runs: pd.DataFrame) -> tuple[str, str]:
    """(quantity, note) of the compute time per sample: per image for the ResNet, else per batch
    element of the workload (an LM's sequence, whose throughput counts tokens)."""
    unit = series.sample_unit(runs)
    if unit == "images":
        return "compute_per_image", "from the 1-GPU runs"
    return "compute_per_sample", f"from the 1-GPU DDP runs; per batch element (throughput counts {unit})"


def _se(value: float) -> str:
    if math.isnan(value):
        return "no standard error (fixed or dof 0)"
    return f"standard error {value:.3g}"


def _bench_overlap_model(model: dict, links: dict, points: pd.DataFrame, result: Fit) -> tuple[dict, str]:
    """The model settings with measured_bandwidth_gb_s from comm_bench when the config leaves it null:
    the link of the largest multi-GPU scaling world size. Not where the training fit's beta_eff is 0
    (clipped): 1 - 0 x bandwidth would claim a fully hidden all-reduce."""
    if model["measured_bandwidth_gb_s"] is not None or not links or points.empty:
        return model, ""
    if not (math.isfinite(result.beta_s_per_byte) and result.beta_s_per_byte > 0):
        return model, " (not derived from comm_bench: the training fit's beta_eff is 0 or not fitted)"
    largest = int(points["world_size"].max())
    if largest < 2:
        return model, ""
    link = link_of(links, largest, model["gpus_per_node"])
    note = f" (bandwidth from comm_bench, {link['placement']} N={int(link['world_size'])})"
    return {**model, "measured_bandwidth_gb_s": float(link["bandwidth_gb_s"])}, note


def analyse(
    runs: pd.DataFrame,
    settings: dict,
    bench_fit: pd.DataFrame | None = None,
    profile_overlap: pd.DataFrame | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(fit table, residuals, predictions) from the run catalog (and the collective benchmark's fit
    and the profile's overlap table, where they exist)."""
    model = settings["comm_model"]
    points, compute = fit_points(runs)
    result = fit(points, compute, model["fit_alpha_us"] * US)
    links = measured_links(bench_fit)
    overlap_model, bench_note = _bench_overlap_model(model, links, points[points["world_size"] > 1], result)
    phi, phi_note = overlap(result, overlap_model)
    phi_note += bench_note
    residuals = (
        result.residuals if result.residuals is not None else pd.DataFrame(columns=list(RESIDUAL_COLUMNS))
    )
    prediction = (
        predict(result, points, model, phi, links)
        if compute
        else pd.DataFrame(columns=list(PREDICTION_COLUMNS))
    )
    extra = bench_rows(links, points, profile_overlap, model["gpus_per_node"])
    table = fit_table(result, phi, phi_note, runs)
    if extra:
        table = pd.concat([table, pd.DataFrame(extra, columns=list(table.columns))], ignore_index=True)
    for _, count, _, note in excluded_rows(runs):
        log.warning("comm model: %d %s", count, note)
    log.info(
        "comm model: %s; alpha_eff %.3g us, bandwidth_eff %.3g GB/s, dof %d",
        result.method,
        result.alpha_s / US,
        result.bandwidth_gb_s,
        result.dof,
    )
    return table, residuals, prediction


def main(argv: Sequence[str] | None = None) -> int:
    parser = cli.parser(__doc__.splitlines()[0])
    parser.add_argument("--runs", required=True, help="The run catalog (runs.csv).")
    parser.add_argument("--fit-out", required=True, help="Fit parameters CSV.")
    parser.add_argument("--residuals-out", required=True, help="Per-run residuals CSV.")
    parser.add_argument(
        "--prediction-out", required=True, help="Predicted efficiency per mode, interconnect, N."
    )
    parser.add_argument(
        "--bench-fit", help="comm_bench_fit.csv (scalestudy.preflight.collectives), optional."
    )
    parser.add_argument("--profile-overlap", help="results/profile/overlap.csv, optional.")
    args = parser.parse_args(argv)
    settings = cli.start(args)
    bench = read_csv(args.bench_fit, BENCH_FIT_COLUMNS) if args.bench_fit else None
    overlap_table = read_csv(args.profile_overlap, OVERLAP_COLUMNS) if args.profile_overlap else None
    table, residuals, prediction = analyse(read_csv(args.runs), settings, bench, overlap_table)
    atomic.write_csv(args.fit_out, table)
    atomic.write_csv(args.residuals_out, residuals)
    atomic.write_csv(args.prediction_out, prediction)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
