"""A constructed study: run folders that follow docs/reference/files.md, with known true answers.

Used by the tests and to render the example figures before (or without) real runs. It constructs the
ResNet-18 DDP study only (images, config.width; no FSDP or LM runs). Step times follow
the alpha-beta model of commmodel.py exactly (plus optional multiplicative noise), so a fit must
recover `Truth.alpha_s` and `Truth.beta_s_per_byte`; everything else (accuracy curves, GPU monitor
samples) is shaped like real training but carries no claim. `Truth.foreign` puts a process that is
not the job's on a point's first GPU, inside its measurement window or before it: the summary's
contention keys are judged from the monitor files as the trainer judges them
(scalestudy.analysis.contention), so a point with one inside is contended and one before is not.
The scaling-loss waterfall's parts (scalestudy.analysis.waterfall) are set by construction too: a
data-loader wait, host time between steps, a straggler and step time nothing measures (the
remainder) go into the step time, and each run's `step_parts` (every rank's window, as the trainer
gathers it) report what the trainer would measure of them; `comm_bench_fit` and `profile_overlap`
give the collective benchmark's and the profile's tables of the same all-reduce, the raw link time
of which `Truth.overlap_fraction` is hidden.

    python -m scalestudy.analysis.constructed_study --config config/config.yaml --out-dir /tmp/study
    [--no-gpu]
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from scalestudy import atomic, commandline
from scalestudy.analysis import commmodel, commpredict, contention, energy, modelsize
from scalestudy.plan import grid, runfiles, studyconfig
from scalestudy.plan.runfiles import GPU_MONITOR, METRICS, MONITOR_COLUMNS, SUMMARY

STARTUP_S = 3.0  # job start to the first training step (imports, data, model, process group)


@dataclass(frozen=True)
class Foreign:
    """A process that is not the job's on rank 0's GPU of the run at `run_dir` (grid.Point.run_dir):
    inside the middle half of its measurement window, or (inside=False) before the window opens."""

    run_dir: str
    inside: bool = True
    pid: int = 31337
    mem_mb: float = 3100.0


@dataclass(frozen=True)
class Truth:
    """The constants the constructed runs are generated from."""

    compute_s_per_image: float = 40e-6  # fp32 compute per image (H100-class ResNet-18 CIFAR)
    half_precision_speedup: float = 1.8  # fp16/bf16 compute is this much faster
    alpha_s: float = 8e-6  # exposed latency per ring step
    beta_s_per_byte: float = 1 / 40e9  # exposed inverse bandwidth
    noise: float = 0.0  # relative std of multiplicative noise on step times
    train_images: int = 50_000
    gpu: bool = True
    gpu_name: str = "NVIDIA H800"
    power_limit_w: float = 700.0  # H800 SXM
    gpus_per_node: int = 8
    seed: int = 0
    foreign: tuple[Foreign, ...] = ()  # processes of others on a point's GPU
    # the waterfall's parts, seconds per step and rank (all 0: step times are compute + comm alone)
    data_wait_s_per_image: float = 0.0  # the loader's wait, in proportion to the per-rank batch
    data_contention_s: float = 0.0  # more wait per doubling of N (a shared filesystem), at N > 1
    host_overhead_s: float = 0.0  # host time between steps (the device idle), at every N
    straggler_s: float = 0.0  # the slowest rank's own step time over the median rank's, at N > 1
    unexplained_s: float = 0.0  # step time at N > 1 that nothing measures
    overlap_fraction: float = 0.0  # hidden share of the raw all-reduce (alpha_s, beta_s: the exposed)
    # per precision, how much faster than fp32 its compute is (others: half_precision_speedup), e.g.
    # (("tf32", 2.9), ("bf16", 2.3)) for a GPU whose bf16 point loses to its tf32 point
    precision_speedups: tuple[tuple[str, float], ...] = ()
    # the scaling stage's 1-rank runs take this much longer per step (a slow or noisy reference):
    # above 1, an N > 1 point whose loss is smaller has an efficiency above 100 % (a measurement problem)
    reference_slowdown: float = 1.0


def exposed_comm_s(truth: Truth, run: dict) -> float:
    """The all-reduce time per step left exposed: the ring model with the truth's alpha and beta."""
    grad = modelsize.gradient_bytes(run["width"], run["comm_hook"])
    buckets = modelsize.bucket_count(grad, run["bucket_cap_mb"])
    return float(
        commpredict.ring_allreduce_s(run["world_size"], grad, buckets, truth.alpha_s, truth.beta_s_per_byte)
    )


def data_wait_s(truth: Truth, run: dict) -> float:
    world = run["world_size"]
    return truth.data_wait_s_per_image * run["per_gpu_batch"] + truth.data_contention_s * math.log2(world)


def step_time(truth: Truth, run: dict, rng: np.random.Generator) -> float:
    speeds = {"fp32": 1.0, **dict(truth.precision_speedups)}
    speed = speeds.get(run["precision"], truth.half_precision_speedup)
    scale = run["width"] ** 2 / 64**2
    clean = truth.compute_s_per_image * scale * run["per_gpu_batch"] / speed + exposed_comm_s(truth, run)
    clean += data_wait_s(truth, run) + truth.host_overhead_s
    if run["world_size"] > 1:
        clean += truth.straggler_s + truth.unexplained_s
    elif run["stage"] == "scaling":
        clean *= truth.reference_slowdown
    return clean * (1.0 + truth.noise * rng.standard_normal()) if truth.noise else clean


def step_parts(truth: Truth, run: dict, step_s: float) -> dict:
    """Every rank's window as the trainer reports it (scalestudy.train.step_parts): the step time,
    the data wait, the device span (step less the host time between steps; none on the CPU) and
    the gradient wait, which is the exposed all-reduce on the slowest rank (rank 0) and that plus
    the wait for it on the others, so that the slowest rank's own step time exceeds the median
    rank's by the truth's straggler (with two ranks the median is their mean)."""
    world, comm = run["world_size"], exposed_comm_s(truth, run)
    own_gap = [0.0] + ([2.0 * truth.straggler_s] if world == 2 else [truth.straggler_s] * (world - 1))
    return {
        "step_s": [step_s] * world,
        "data_wait_s": [data_wait_s(truth, run)] * world,
        "device_busy_s": [step_s - truth.host_overhead_s] * world if truth.gpu else None,
        "gradient_wait_s": [comm + gap for gap in own_gap[:world]],
    }


def comm_bench_fit(truth: Truth, config: dict) -> pd.DataFrame:
    """comm_bench_fit.csv as the collective benchmark fits it (scalestudy.preflight.collectives):
    the raw all-reduce link, alpha / (1 - phi) per ring step and its bus bandwidth, per world size."""
    hidden = 1.0 - truth.overlap_fraction
    rows = [
        {
            "collective": "all_reduce",
            "world_size": world,
            "nodes": math.ceil(world / truth.gpus_per_node),
            "placement": commpredict.INTRA if world <= truth.gpus_per_node else commpredict.INTER,
            "link_alpha_s": truth.alpha_s / hidden,
            "bandwidth_gb_s": hidden / truth.beta_s_per_byte / commpredict.GB,
            "r2": 1.0,
        }
        for world in config["scaling"]["world_sizes"]
        if world > 1
    ]
    return pd.DataFrame(rows, columns=list(commmodel.BENCH_FIT_COLUMNS))


def profile_overlap(truth: Truth, config: dict, steps: int = 10) -> pd.DataFrame:
    """The profile's overlap.csv (scalestudy.profiling.schema.OVERLAP_COLUMNS) of its world sizes:
    per rank the raw all-reduce of `steps` steps, of which overlap_fraction ran under compute."""
    rows = []
    for point in grid.profile_points(config):
        run = grid.run_config(config, point)
        world = run["world_size"]
        raw = exposed_comm_s(truth, run) / (1.0 - truth.overlap_fraction) * steps
        compute = truth.compute_s_per_image * run["per_gpu_batch"] * steps
        for rank in range(world):
            rows.append(
                {
                    "world_size": world,
                    "rank": rank,
                    "tool": "nsys",
                    "method": "nsys_trace",
                    "compute_s": compute,
                    "communication_s": raw,
                    "overlap_s": truth.overlap_fraction * raw,
                    "exposed_communication_s": (1.0 - truth.overlap_fraction) * raw,
                    "overlap_fraction": truth.overlap_fraction if raw > 0 else math.nan,
                    "steps": steps,
                    "window_s": compute + (1.0 - truth.overlap_fraction) * raw,
                }
            )
    return pd.DataFrame(rows)


def accuracy_curve(run: dict, epochs: int, rng: np.random.Generator) -> np.ndarray:
    """Test accuracy per epoch: saturating, slower per epoch for large global batches, seed jitter."""
    tau = 0.9 * (run["global_batch"] / 128) ** 0.3
    clean = 0.93 * (1.0 - np.exp(-np.arange(1, epochs + 1) / tau))
    return np.clip(clean + rng.normal(0.0, 0.008, epochs), 0.0, 1.0)


def metrics_frame(run: dict, step_s: float, truth: Truth, rng: np.random.Generator) -> pd.DataFrame:
    epochs = run["epochs"]
    steps = math.ceil(truth.train_images / run["global_batch"])
    if run["max_steps_per_epoch"]:
        steps = min(steps, run["max_steps_per_epoch"])
    epoch_time = np.full(epochs, steps * step_s)
    epoch_time[0] *= 1.15  # the first epoch warms up (and the summary's median skips it)
    ips = steps * run["global_batch"] / epoch_time
    acc = accuracy_curve(run, epochs, rng)
    return pd.DataFrame(
        {
            "epoch": np.arange(1, epochs + 1),
            "train_loss": 2.3 * (1 - acc) + 0.05,
            "train_acc": np.minimum(acc + 0.03, 1.0),
            "test_loss": 2.3 * (1 - acc) + 0.1,
            "test_acc": acc,
            "epoch_time_s": epoch_time,
            "images_per_s": ips,
            "images_per_s_per_gpu": ips / run["world_size"],
            "global_batch": run["global_batch"],
            "per_gpu_batch": run["per_gpu_batch"],
            "world_size": run["world_size"],
            "lr": run["lr"],
            "wall_time_s": np.cumsum(epoch_time * 1.05),
        }
    )


def results_of(run: dict, metrics: pd.DataFrame, step_s: float, truth: Truth) -> dict:
    later = metrics.iloc[1:] if len(metrics) > 1 else metrics
    reached = metrics[metrics["test_acc"] >= run["target_accuracy"]]
    return {
        "epochs": run["epochs"],
        "steps": int(len(metrics) * round(metrics["epoch_time_s"].iloc[-1] / step_s)),
        "world_size": run["world_size"],
        "global_batch": run["global_batch"],
        "per_gpu_batch": run["per_gpu_batch"],
        "images_per_s": float(later["images_per_s"].median()),
        "images_per_s_per_gpu": float(later["images_per_s_per_gpu"].median()),
        "epoch_time_s": float(later["epoch_time_s"].median()),
        "step_time_s": step_s,
        "final_test_acc": float(metrics["test_acc"].iloc[-1]),
        "best_test_acc": float(metrics["test_acc"].max()),
        "final_train_loss": float(metrics["train_loss"].iloc[-1]),
        "time_to_target_s": float(reached["wall_time_s"].iloc[0]) if len(reached) else None,
        "target_accuracy": run["target_accuracy"],
        "total_time_s": float(metrics["wall_time_s"].iloc[-1]) + STARTUP_S + 2.0,
        # the steady-state window on the monitor's clock (t0 = job start): after the first epoch
        "measure_start_s": STARTUP_S + float(metrics["wall_time_s"].iloc[0] if len(metrics) > 1 else 0.0),
        "measure_end_s": STARTUP_S + float(metrics["wall_time_s"].iloc[-1]),
        "resumed_from_step": None,
        "device": "cuda" if truth.gpu else "cpu",
        "device_name": truth.gpu_name if truth.gpu else "x86_64",
        "backend": "nccl" if truth.gpu else "gloo",
        "step_parts": step_parts(truth, run, step_s),
    }


def foreign_seen(times: np.ndarray, results: dict, foreign: Foreign) -> np.ndarray:
    """The samples (by time) in which the foreign process is on the GPU."""
    start, end = results["measure_start_s"], results["measure_end_s"]
    if foreign.inside:
        return (times >= start + 0.25 * (end - start)) & (times <= start + 0.75 * (end - start))
    return times < start


def monitor_frame(
    run: dict, results: dict, truth: Truth, rng: np.random.Generator, foreign: Foreign | None = None
) -> pd.DataFrame:
    """NVML-like samples, one row per GPU and sample; busier (higher SM, power) when compute dominates,
    idle during start-up and after training. SM activity (GPM) sits below kernel activity, as on a real
    GPU where kernels do not fill every SM."""
    times = np.linspace(0.0, results["total_time_s"], 80)
    training = (times >= STARTUP_S) & (times <= results["measure_end_s"])
    comm_share = 1.0 - 1.0 / (1.0 + 0.08 * math.log2(run["world_size"]))
    frames = []
    for rank in range(run["world_size"]):
        host, gpu = f"gpu{rank // truth.gpus_per_node + 1:03d}", rank % truth.gpus_per_node
        busy = np.clip(97 * (1 - comm_share) + rng.normal(0, 1.5, times.size), 0, 100)
        busy[~training | (np.arange(times.size) % 20 == 19)] *= 0.3  # start-up, evaluation, the end
        power_w = 90 + 5.0 * busy
        seen = foreign_seen(times, results, foreign) if foreign and rank == 0 else np.zeros(times.size, bool)
        frames.append(
            pd.DataFrame(
                {
                    "time_s": times,
                    "host": host,
                    "gpu_index": gpu,
                    "gpu_uuid": f"GPU-{rank:08x}",
                    "gpu_name": truth.gpu_name,
                    "rank": rank,
                    "sm_active_pct": 0.9 * busy,
                    "kernel_active_pct": np.minimum(busy + 3.0, 100.0),
                    "mem_util_pct": busy * 0.6,
                    "power_w": power_w,
                    "power_limit_w": truth.power_limit_w,
                    "power_fraction": power_w / truth.power_limit_w,
                    "pcie_rx_mb_s": 900 + rng.normal(0, 80, times.size),
                    "pcie_tx_mb_s": 300 + rng.normal(0, 30, times.size),
                    "mem_used_mb": 20_000.0 + np.where(seen, foreign.mem_mb if foreign else 0.0, 0.0),
                    "temperature_c": 40 + 0.35 * busy,
                    "processes": 1 + seen.astype(int),
                    "foreign_processes": seen.astype(int),
                    "foreign_mem_mb": np.where(seen, foreign.mem_mb if foreign else 0.0, 0.0),
                    "host_load_1m": 6.0,  # a constant: the generator's draws stay those of before
                    "host_cpus": 64,
                    # the energy counter: the power samples' trapezoid, so both sources agree here
                    "energy_j": np.concatenate(
                        ([0.0], np.cumsum((power_w[1:] + power_w[:-1]) / 2 * np.diff(times)))
                    ),
                }
            )
        )
    return pd.concat(frames, ignore_index=True)[list(MONITOR_COLUMNS)]


def monitor_info(samples: pd.DataFrame, foreign: Foreign | None) -> dict:
    """gpu_monitor.json as the trainer writes it: per node its GPUs (with the foreign process's
    sighting) and the job's CPUs (16 per rank)."""
    nodes = []
    for host, rows in samples.groupby("host", sort=True):
        gpus = []
        for (uuid, rank), gpu_rows in rows.groupby(["gpu_uuid", "rank"], sort=True):
            seen = gpu_rows[gpu_rows["foreign_processes"] > 0]["time_s"]
            spans = [] if seen.empty or foreign is None else [_span(foreign, seen)]
            processes = {"expected_own": 1, "pid_namespace_samples": 0, "foreign": spans}
            gpus.append({"uuid": uuid, "host": host, "rank": int(rank), "processes": processes})
        ranks = sorted(int(rank) for rank in rows["rank"].unique())
        cpus = [cpu for rank in ranks for cpu in range(16 * (rank % 4), 16 * (rank % 4 + 1))]
        nodes.append(
            {"host": host, "ranks": ranks, "gpus": gpus, "cpus": sorted(set(cpus)), "available": True}
        )
    return {"available": True, "reason": None, "samples": len(samples), "nodes": nodes}


def _span(foreign: Foreign, seen: pd.Series) -> dict:
    first, last = float(seen.min()), float(seen.max())
    return {
        "pid": foreign.pid,
        "first_s": first,
        "last_s": last,
        "samples": len(seen),
        "max_mem_mb": foreign.mem_mb,
    }


def write_run(root: Path, config: dict, point: grid.Point, truth: Truth, rng: np.random.Generator) -> Path:
    run = grid.run_config(config, point)
    nodes = math.ceil(run["world_size"] / truth.gpus_per_node)
    out = root / point.run_dir
    step_s = step_time(truth, run, rng)
    metrics = metrics_frame(run, step_s, truth, rng)
    results = results_of(run, metrics, step_s, truth)
    foreign = next((f for f in truth.foreign if f.run_dir == point.run_dir), None)
    prov = {
        "host": "gpu001",
        "seed": run["seed"],
        "git_commit": "0" * 40,
        "slurm": {
            "job_id": str(1000 + rng.integers(0, 10**6)),
            "job_nodelist": f"gpu[001-{nodes:03d}]",
            "job_num_nodes": str(nodes),
        },
    }
    atomic.write_csv(out / METRICS, metrics)
    if truth.gpu:
        samples = monitor_frame(run, results, truth, rng, foreign)
        atomic.write_csv(out / GPU_MONITOR, samples)
        atomic.write_json(out / runfiles.GPU_MONITOR_INFO, monitor_info(samples, foreign))
    else:
        atomic.write_csv(out / GPU_MONITOR, pd.DataFrame(columns=list(MONITOR_COLUMNS)))
        atomic.write_json(
            out / runfiles.GPU_MONITOR_INFO, {"available": False, "reason": "no NVIDIA GPU (device cpu)"}
        )
    results.update(contention.of_folder(out, results))  # as the trainer does, from the files above
    results.update(energy.of_folder(out, results))
    atomic.write_json(out / SUMMARY, {"run": run, "results": results, "provenance": prov})
    return out


def make_study(root: str | Path, config: dict, truth: Truth = Truth()) -> list[Path]:
    """Write every grid point's run folder of `config` under root; returns the folders."""
    rng = np.random.default_rng(truth.seed)
    return [write_run(Path(root), config, point, truth, rng) for point in grid.all_points(config)]


def main() -> int:
    parser = commandline.parser(__doc__)
    parser.add_argument("--config", required=True, help="Study config (YAML) whose grid is constructed.")
    parser.add_argument("--out-dir", required=True, help="Root under which results/runs/... is written.")
    parser.add_argument("--no-gpu", action="store_true", help="Construct a CPU study (no monitor samples).")
    parser.add_argument("--noise", type=float, default=0.02, help="Relative step-time noise (default 0.02).")
    args = parser.parse_args()
    truth = Truth(noise=args.noise, gpu=not args.no_gpu)
    folders = make_study(args.out_dir, studyconfig.load(args.config), truth)
    print(f"{len(folders)} run folders under {args.out_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


# ----------------------------------------------------------------------------- in-memory catalog rows


def run_row(
    stage: str,
    world: int,
    per_gpu_batch: int,
    step_s: float,
    mode: str | None = None,
    repeat: int = 0,
    **extra,
) -> dict:
    """One run-catalog row (the runs.csv columns the analysis reads) of a run with this step time."""
    per_gpu = per_gpu_batch / step_s
    row = {
        "stage": stage,
        "point": f"{mode or stage}/w{world}_r{repeat}",
        "world_size": world,
        "per_gpu_batch": per_gpu_batch,
        "global_batch": per_gpu_batch * world,
        "images_per_s": per_gpu * world,
        "images_per_s_per_gpu": per_gpu,
        "epoch_time_s": 50_000 / (per_gpu * world),
        "total_time_s": 3600.0,
        "final_test_acc": 0.9,
        "time_to_target_s": 1000.0,
        "device": "cuda",
        "device_name": "NVIDIA H100 80GB HBM3",
        "config.mode": mode,
        "config.repeat": repeat,
        "config.precision": "bf16",
        "config.width": 64,
        "config.bucket_cap_mb": 25,
        "config.comm_hook": "none",
    }
    row.update(extra)
    return row
