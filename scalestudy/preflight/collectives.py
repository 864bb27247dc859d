"""The collective benchmark: all-reduce, all-gather and reduce-scatter over the study's backend, timed
as nccl-tests times them, and the alpha-beta fit of the times.

`run` runs on every rank of a job shaped like a training job of that world size (started by
`python -m scalestudy.launch --module scalestudy.preflight.collectives`; NCCL on GPUs, gloo on
CPUs): per collective and message size it times `iters` calls after `warmup_iters`, keeps the
slowest rank's mean time, and rank 0 writes the rows with nccl-tests' algbw and busbw; a collective
the backend lacks is a row with a note, never a number. `fit` combines the world sizes and fits
time = alpha + beta * bytes per collective, world size and placement by least squares on the
relative error, with the ring model's link alpha and bus bandwidth. The commands, formulas and the
fit's choices: docs/reference/methods.md, "The collective benchmark".
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import socket
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from scalestudy import atomic, provenance
from scalestudy.analysis.tableio import read_csv
from scalestudy.launch import distributed
from scalestudy.plan import schema
from scalestudy.plan.runfiles import NOT_MEASURED
from scalestudy.preflight import common

log = logging.getLogger("scalestudy.commbench")

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")
INTRA, INTER = "intra-node", "inter-node"
WORD_BYTES = 4  # float32, as nccl-tests' default
GB = 1e9
BENCH_COLUMNS = (
    "collective",
    "world_size",
    "nodes",
    "placement",
    "hosts",
    "backend",
    "device",
    "bytes",
    "elements",
    "time_s",
    "algbw_gb_s",
    "busbw_gb_s",
    "warmup",
    "repeats",
    "note",
)
FIT_COLUMNS = (
    "collective",
    "world_size",
    "nodes",
    "placement",
    "backend",
    "points",
    "alpha_s",
    "beta_s_per_byte",
    "algbw_gb_s",
    "bandwidth_gb_s",
    "link_alpha_s",
    "r2",
    "max_bytes",
    "busbw_at_max_gb_s",
    "method",
)
# The settings the comm_bench rule passes (rules/comm.smk): comm_bench's and three of train's, with the
# schema's defaults.
TRAIN_SETTINGS = {"device": "device", "backend": "backend", "timeout_s": "pg_timeout_s"}
SETTINGS_DEFAULTS: dict[str, Any] = {
    **schema.defaults("comm_bench"),
    **{key: schema.node("train", name)["default"] for key, name in TRAIN_SETTINGS.items()},
}


# --------------------------------------------------------------------------- nccl-tests arithmetic


def bus_factor(collective: str, world_size: int) -> float:
    """busbw / algbw for `collective` on `world_size` ranks (nccl-tests' PERFORMANCE.md)."""
    n = world_size
    if collective == "all_reduce":
        return 2.0 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter"):
        return (n - 1) / n
    raise ValueError(f"unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}")


def ring_steps(collective: str, world_size: int) -> int:
    """Latency terms of the ring algorithm: 2(n-1) for all-reduce, n-1 for all-gather/reduce-scatter."""
    return int(round(bus_factor(collective, world_size) * world_size))


def algbw_gb_s(nbytes: float, time_s: float) -> float:
    return nbytes / time_s / GB


def busbw_gb_s(collective: str, world_size: int, nbytes: float, time_s: float) -> float:
    return algbw_gb_s(nbytes, time_s) * bus_factor(collective, world_size)


def message_sizes(min_bytes: int, max_bytes: int, step_factor: int) -> list[int]:
    """min_bytes, min_bytes * f, ... up to max_bytes (nccl-tests -b -e -f)."""
    if min_bytes < 1 or max_bytes < min_bytes or step_factor < 2:
        raise ValueError(
            f"comm_bench: need 1 <= min_bytes <= max_bytes and step_factor >= 2, got "
            f"min_bytes={min_bytes}, max_bytes={max_bytes}, step_factor={step_factor}"
        )
    sizes, size = [], min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size *= step_factor
    return sizes


def elements_for(collective: str, nbytes: int, world_size: int) -> int:
    """float32 elements of the whole buffer: a multiple of world_size for the gather/scatter ones
    (nccl-tests rounds the count the same way), at least one element per rank."""
    count = max(nbytes // WORD_BYTES, 1)
    if collective == "all_reduce":
        return count
    return max(count // world_size, 1) * world_size


def placement(hosts: Sequence[str]) -> str:
    return INTRA if len(set(hosts)) <= 1 else INTER


# --------------------------------------------------------------------------- the alpha-beta fit


def fit_alpha_beta(nbytes: Sequence[float], times: Sequence[float]) -> dict[str, Any]:
    """time = alpha + beta * bytes, least squares on the relative error; a negative alpha or beta is
    clipped to 0 and the other refitted (the method says so). r2 is on the times themselves."""
    size = np.asarray(nbytes, dtype=float)
    t = np.asarray(times, dtype=float)
    keep = np.isfinite(t) & (t > 0)
    size, t = size[keep], t[keep]
    if len(t) < 2 or len(set(size)) < 2:
        return {
            "alpha_s": math.nan,
            "beta_s_per_byte": math.nan,
            "r2": math.nan,
            "points": len(t),
            "method": "not fitted: fewer than two message sizes with a time",
        }
    design = np.column_stack([np.ones_like(size), size]) / t[:, None]
    coef, *_ = np.linalg.lstsq(design, np.ones_like(t), rcond=None)
    method = "least squares on relative error"
    if coef.min() < 0:
        clipped = int(np.argmin(coef))
        keep_col = 1 - clipped
        only, *_ = np.linalg.lstsq(design[:, [keep_col]], np.ones_like(t), rcond=None)
        coef = np.zeros(2)
        coef[keep_col] = max(float(only[0]), 0.0)
        method += f"; {('alpha', 'beta')[clipped]} clipped to 0 (negative estimate)"
    predicted = coef[0] + coef[1] * size
    total = float(((t - t.mean()) ** 2).sum())
    r2 = 1.0 - float(((t - predicted) ** 2).sum()) / total if total > 0 else math.nan
    return {
        "alpha_s": float(coef[0]),
        "beta_s_per_byte": float(coef[1]),
        "r2": r2,
        "points": len(t),
        "method": method,
    }


def fit_table(bench):
    """One fit row per (collective, world size, nodes, placement, backend) of the bench rows."""
    rows = []
    keys = ["collective", "world_size", "nodes", "placement", "backend"]
    for key, group in bench.groupby(keys, sort=True):
        collective, world = key[0], int(key[1])
        fitted = fit_alpha_beta(group["bytes"], group["time_s"])
        beta = fitted["beta_s_per_byte"]
        with_time = group.dropna(subset=["time_s"])
        largest = with_time.loc[with_time["bytes"].idxmax()] if len(with_time) else None
        note = "; ".join(sorted({str(n) for n in group["note"].dropna() if str(n)}))
        rows.append(
            dict(
                zip(keys, key, strict=True),
                points=fitted["points"],
                alpha_s=fitted["alpha_s"],
                beta_s_per_byte=beta,
                algbw_gb_s=1.0 / beta / GB if beta > 0 else math.nan,
                bandwidth_gb_s=bus_factor(collective, world) / beta / GB if beta > 0 else math.nan,
                link_alpha_s=fitted["alpha_s"] / ring_steps(collective, world),
                r2=fitted["r2"],
                max_bytes=int(largest["bytes"]) if largest is not None else math.nan,
                busbw_at_max_gb_s=float(largest["busbw_gb_s"]) if largest is not None else math.nan,
                method=fitted["method"] + (f"; {note}" if note else ""),
            )
        )
    return pd.DataFrame(rows, columns=list(FIT_COLUMNS))


# --------------------------------------------------------------------------- the ranks


def settings_from_json(text: str) -> dict[str, Any]:
    given = json.loads(text)
    unknown = sorted(set(given) - set(SETTINGS_DEFAULTS))
    if unknown:
        raise ValueError(f"comm_bench settings: unknown key(s) {unknown}")
    settings = {**SETTINGS_DEFAULTS, **given}
    bad = [c for c in settings["collectives"] if c not in COLLECTIVES]
    if bad or not settings["collectives"]:
        raise ValueError(f"comm_bench.collectives: {bad or 'empty'}; known: {', '.join(COLLECTIVES)}")
    for key in ("warmup_iters", "iters"):
        if not isinstance(settings[key], int) or settings[key] < (0 if key == "warmup_iters" else 1):
            raise ValueError(f"comm_bench.{key} must be a non-negative integer, got {settings[key]!r}")
    message_sizes(settings["min_bytes"], settings["max_bytes"], settings["step_factor"])
    return settings


class Bench:
    """One rank's view of the benchmark (torch imported here only)."""

    def __init__(self, settings: dict[str, Any], device, backend: str, rank: int, world: int):
        import torch
        import torch.distributed as dist

        self.torch, self.dist = torch, dist
        self.settings, self.device, self.backend = settings, device, backend
        self.rank, self.world = rank, world

    def sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)

    def buffers(self, collective: str, elements: int):
        torch, n = self.torch, self.world
        whole = torch.ones(elements, dtype=torch.float32, device=self.device)
        if collective == "all_reduce":
            return whole, None
        chunk = torch.ones(elements // n, dtype=torch.float32, device=self.device)
        return (chunk, whole) if collective == "all_gather" else (whole, chunk)

    def call(self, collective: str, source, target) -> None:
        dist = self.dist
        if collective == "all_reduce":
            dist.all_reduce(source)
        elif collective == "all_gather":
            # torch 2.14 names them *_single and deprecates *_tensor; older torch has only the latter
            (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(target, source)
        else:
            (getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor)(target, source)

    def time_one(self, collective: str, elements: int) -> float:
        """Mean seconds per call on this rank (warm-up, barrier, `iters` calls, device sync)."""
        source, target = self.buffers(collective, elements)
        for _ in range(self.settings["warmup_iters"]):
            self.call(collective, source, target)
        self.sync()
        self.dist.barrier()
        start = time.perf_counter()
        for _ in range(self.settings["iters"]):
            self.call(collective, source, target)
        self.sync()
        return (time.perf_counter() - start) / self.settings["iters"]

    def slowest(self, seconds: float) -> float:
        value = self.torch.tensor([seconds], dtype=self.torch.float64, device=self.device)
        self.dist.all_reduce(value, op=self.dist.ReduceOp.MAX)
        return float(value.item())

    def supported(self, collective: str) -> str:
        """'' if the backend runs the collective, else why not (found with one tiny call)."""
        try:
            self.call(collective, *self.buffers(collective, self.world))
            self.sync()
        except (RuntimeError, NotImplementedError, ValueError) as error:
            return f"{NOT_MEASURED}: {collective} is not supported by {self.backend} here ({error})"
        return ""


def run_ranks(settings: dict[str, Any]) -> list[dict[str, Any]] | None:
    """Benchmark every collective and size; the rows on rank 0, None on the other ranks."""
    env = distributed.from_environ()
    if env.world_size < 2:
        raise ValueError("comm_bench needs at least 2 ranks (one rank communicates with nobody)")
    device = distributed.select_device(settings["device"], env.local_rank)
    backend = distributed.select_backend(settings["backend"], device)
    distributed.init_process_group(env, backend, settings["timeout_s"], device)
    try:
        hosts = distributed.all_gather_object(socket.gethostname())
        bench = Bench(settings, device, backend, env.rank, env.world_size)
        where = {"world_size": env.world_size, "nodes": len(set(hosts)), "placement": placement(hosts)}
        where["hosts"] = " ".join(sorted(set(hosts)))
        where |= {"backend": backend, "device": device.type}
        rows = []
        sizes = message_sizes(settings["min_bytes"], settings["max_bytes"], settings["step_factor"])
        for collective in settings["collectives"]:
            rows += _collective_rows(bench, collective, sizes, where, env.is_main)
        distributed.barrier()
    finally:
        distributed.destroy_process_group()
    return rows if env.is_main else None


def _collective_rows(bench: Bench, collective: str, sizes, where: dict, is_main: bool) -> list[dict]:
    note = bench.supported(collective)
    rows = []
    started = time.monotonic()
    for nbytes in sizes:
        elements = elements_for(collective, nbytes, bench.world)
        actual = elements * WORD_BYTES
        seconds = math.nan if note else bench.slowest(bench.time_one(collective, elements))
        measured = math.isfinite(seconds)
        rows.append(
            {
                "collective": collective,
                **where,
                "bytes": actual,
                "elements": elements,
                "time_s": seconds,
                "algbw_gb_s": algbw_gb_s(actual, seconds) if measured else math.nan,
                "busbw_gb_s": busbw_gb_s(collective, bench.world, actual, seconds) if measured else math.nan,
                "warmup": bench.settings["warmup_iters"],
                "repeats": bench.settings["iters"],
                "note": note,
            }
        )
    if is_main:
        last = rows[-1]
        log.info(
            "%s on %d ranks (%s, %s): %d sizes in %.1f s; %s",
            collective,
            bench.world,
            where["placement"],
            where["backend"],
            len(sizes),
            time.monotonic() - started,
            note or f"busbw {last['busbw_gb_s']:.3g} GB/s at {last['bytes']} B",
        )
    return rows


def write_bench(rows: list[dict[str, Any]], out: str, settings: dict[str, Any]) -> None:
    frame = pd.DataFrame(rows, columns=list(BENCH_COLUMNS))
    record = provenance.flatten(provenance.collect(config=settings), "provenance.")
    for column, value in record.items():
        frame[column] = value
    atomic.write_csv(out, frame)


# --------------------------------------------------------------------------- command line


def _run(args: argparse.Namespace) -> int:
    settings = settings_from_json(args.settings_json)
    rows = run_ranks(settings)
    if rows is not None:
        write_bench(rows, args.out, settings)
        log.info("%d rows -> %s", len(rows), args.out)
    return 0


def _fit(args: argparse.Namespace) -> int:
    frames = [read_csv(path, ["collective", "world_size", "bytes", "time_s"]) for path in args.bench]
    bench = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=list(BENCH_COLUMNS))
    bench["note"] = bench["note"].astype(object).where(bench["note"].notna(), "")
    table = fit_table(bench)
    atomic.write_csv(args.busbw_out, bench)
    atomic.write_csv(args.fit_out, table)
    for _, row in table.iterrows():
        log.info(
            "%s N=%d %s: alpha %.3g us, bus bandwidth %.3g GB/s (r2 %.3f)",
            row["collective"],
            row["world_size"],
            row["placement"],
            row["alpha_s"] * 1e6,
            row["bandwidth_gb_s"],
            row["r2"],
        )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser, sub = common.command_parser("collectives", __doc__)
    run = sub.add_parser("run", help="benchmark the collectives (every rank runs this)")
    run.add_argument("--settings-json", required=True, help="the comm_bench settings (see SETTINGS_DEFAULTS)")
    common.add_out(run, "CSV of this world size (rank 0 writes it)")
    fit = sub.add_parser("fit", help="combine the world sizes and fit alpha and beta")
    fit.add_argument("--bench", nargs="*", default=[], help="the per-world-size CSVs")
    fit.add_argument("--busbw-out", required=True, help="all rows (results/comm/busbw.csv)")
    fit.add_argument("--fit-out", required=True, help="the fit table (results/tables/comm_bench_fit.csv)")
    return common.run_command(parser.parse_args(argv), {"run": _run, "fit": _fit}, "commbench")


if __name__ == "__main__":
    raise SystemExit(main())
