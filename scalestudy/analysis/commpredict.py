"""The communication model's ring all-reduce, its parameters (Fit: scalestudy.analysis.commmodel
fits them) and its predictions: the time of a ring all-reduce, efficiency vs N per mode for the
fitted curve, each configured interconnect and the collective benchmark's measured links, and the
fit table's rows comparing the benchmark with the profile's measured all-reduce time."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

US = 1e-6
GB = 1e9
FIT_CURVE = "fit (as measured)"
MEASURED_CURVE = "measured collectives (comm_bench)"
INTRA, INTER = "intra-node", "inter-node"  # scalestudy.preflight.collectives's placements
PREDICTION_COLUMNS = ("mode", "curve", "world_size", "compute_s", "exposed_comm_s", "step_s", "efficiency")


@dataclass
class Fit:
    method: str
    alpha_s: float
    beta_s_per_byte: float
    n_points: int
    dof: int
    rms_residual_s: float = math.nan
    alpha_se_s: float = math.nan
    beta_se: float = math.nan
    compute_s_per_image: dict = field(default_factory=dict)
    residuals: pd.DataFrame | None = None

    @property
    def bandwidth_gb_s(self) -> float:
        return 1.0 / self.beta_s_per_byte / GB if self.beta_s_per_byte > 0 else math.inf

    @property
    def bandwidth_se_gb_s(self) -> float:
        """Standard error of 1/beta by the delta method: se(beta) / beta^2."""
        if not self.beta_s_per_byte > 0:
            return math.nan
        return self.beta_se / self.beta_s_per_byte**2 / GB


def ring_allreduce_s(world, grad_bytes, buckets, alpha_s, beta_s_per_byte):
    """Ring all-reduce of grad_bytes in `buckets` calls: 2(N-1)/N S beta + 2(N-1) k alpha (0 at N=1)."""
    world = np.asarray(world, dtype=float)
    return (
        2.0 * (world - 1.0) / world * grad_bytes * beta_s_per_byte + 2.0 * (world - 1.0) * buckets * alpha_s
    )


def world_grid(max_world: int, measured: Sequence[int]) -> list[int]:
    powers = [2**i for i in range(int(math.log2(max_world)) + 1)]
    return sorted(set(powers) | {int(n) for n in measured if n <= max_world})


def predict(f: Fit, points: pd.DataFrame, model: dict, phi: float, links: dict | None = None) -> pd.DataFrame:
    """Efficiency vs N for each mode: the fitted (as-measured) curve, one per configured interconnect
    and, with `links` (measured_links), the measured collectives."""
    rows = []
    for mode, group in points.groupby("mode"):
        worlds = world_grid(model["max_world"], group["world_size"].unique())
        compute_of = _compute_per_gpu(mode, group, f.compute_s_per_image[mode])
        grad, buckets = float(group["grad_bytes"].iloc[0]), int(group["buckets"].iloc[0])
        configured = model["interconnects"]
        curves = {link["name"]: _link_curve(link, model, grad, buckets, phi) for link in configured}
        if links:
            name, comm = _measured_curve(links, model, grad, buckets, phi)
            curves[name] = comm
        if math.isfinite(f.alpha_s):
            curves = {FIT_CURVE: _fit_curve(f, grad, buckets), **curves}
        for name, comm in curves.items():
            for n in worlds:
                rows.append(_prediction_row(mode, name, n, compute_of(n), float(comm(n))))
    return pd.DataFrame(rows, columns=list(PREDICTION_COLUMNS)).dropna(subset=["efficiency"])


def _compute_per_gpu(mode: str, group: pd.DataFrame, c: float):
    """Compute time per step at N GPUs: strong keeps the global batch, weak the per-GPU batch."""
    if mode == "strong":
        global_batch = float((group["per_gpu_batch"] * group["world_size"]).iloc[0])
        return lambda n: c * global_batch / n if global_batch / n >= 1 else math.nan
    per_gpu = float(group["per_gpu_batch"].iloc[0])
    return lambda n: c * per_gpu


def _fit_curve(f: Fit, grad: float, buckets: int):
    return lambda n: ring_allreduce_s(n, grad, buckets, f.alpha_s, f.beta_s_per_byte)


def _link_curve(link: dict, model: dict, grad: float, buckets: int, phi: float):
    def comm(n: int) -> float:
        chosen = model["intra_node"] if n <= model["gpus_per_node"] else link
        raw = ring_allreduce_s(
            n, grad, buckets, chosen["alpha_us"] * US, 1.0 / (chosen["bandwidth_gb_s"] * GB)
        )
        return (1.0 - phi) * raw

    return comm


def measured_links(bench_fit: pd.DataFrame | None) -> dict[str, pd.Series]:
    """{placement: the all-reduce fit of the largest world size measured there} from comm_bench."""
    if bench_fit is None or bench_fit.empty:
        return {}
    usable = bench_fit[
        (bench_fit["collective"] == "all_reduce")
        & np.isfinite(bench_fit["bandwidth_gb_s"].astype(float))
        & np.isfinite(bench_fit["link_alpha_s"].astype(float))
    ]
    return {
        placement: group.sort_values("world_size").iloc[-1]
        for placement, group in usable.groupby("placement")
        if placement in (INTRA, INTER)
    }


def link_of(links: dict, n: int, gpus_per_node: int) -> pd.Series:
    """The measured link (measured_links) a ring of n ranks uses: intra-node up to gpus_per_node,
    inter-node beyond; the other where only one was measured."""
    wanted = INTRA if n <= gpus_per_node else INTER
    return links.get(wanted, links.get(INTRA if wanted == INTER else INTER))


def _measured_curve(links: dict, model: dict, grad: float, buckets: int, phi: float):
    name = MEASURED_CURVE if INTER in links else f"{MEASURED_CURVE}, {next(iter(links))} link only"

    def comm(n: int) -> float:
        link = link_of(links, n, model["gpus_per_node"])
        beta = 1.0 / (float(link["bandwidth_gb_s"]) * GB)
        return (1.0 - phi) * float(ring_allreduce_s(n, grad, buckets, float(link["link_alpha_s"]), beta))

    return name, comm


def bench_rows(links: dict, points: pd.DataFrame, overlap_table: pd.DataFrame | None, gpn: int) -> list:
    """Fit-table rows: the measured link parameters and, per profiled world size, the gradient
    all-reduce time per step the profile measured beside the one the benchmark predicts."""
    rows = []
    for placement, link in sorted(links.items()):
        where = f"comm_bench all_reduce at N={int(link['world_size'])} ({int(link['nodes'])} node(s))"
        rows.append((f"measured_alpha[{placement}]", float(link["link_alpha_s"]) / US, "us", where))
        rows.append(
            (
                f"measured_bandwidth[{placement}]",
                float(link["bandwidth_gb_s"]),
                "GB/s",
                f"{where}; bus bandwidth of the fitted slope; r2 {float(link['r2']):.3f}",
            )
        )
    if overlap_table is None or overlap_table.empty or points.empty:
        return rows
    grad, buckets = float(points["grad_bytes"].iloc[0]), int(points["buckets"].iloc[0])
    for world, group in overlap_table.groupby("world_size"):
        world = int(world)
        if world < 2:
            continue
        steps = group["steps"].astype(float).clip(lower=1)
        comm = float((group["communication_s"] / steps).mean())
        exposed = float((group["exposed_communication_s"] / steps).mean())
        tool = ", ".join(sorted(map(str, group["tool"].unique())))
        rows.append((f"profile_allreduce_per_step[N={world}]", comm * 1e3, "ms", f"{tool}, mean over ranks"))
        rows.append((f"profile_exposed_per_step[N={world}]", exposed * 1e3, "ms", f"{tool}, not hidden"))
        if links:
            link = link_of(links, world, gpn)
            predicted = ring_allreduce_s(
                world, grad, buckets, float(link["link_alpha_s"]), 1.0 / (float(link["bandwidth_gb_s"]) * GB)
            )
            note = (
                f"ring model with the measured {link['placement']} alpha and bandwidth, {buckets} bucket(s)"
            )
            rows.append((f"bench_allreduce_per_step[N={world}]", float(predicted) * 1e3, "ms", note))
    return rows


def _prediction_row(mode, curve, n, compute_s, comm_s):
    step = compute_s + comm_s
    return (mode, curve, n, compute_s, comm_s, step, compute_s / step if step > 0 else math.nan)
