"""python -m scalestudy.benchmark.lm [--preset demo|gpt2-small] [--device auto|cpu|cuda]
    [--precision fp32|bf16] [--per-gpu-batch B] [--micro-batch M] [--steps N] [--warmup W]
    [--parallelism ddp fsdp] [--repeats R] [--world-size R] [--compile | --no-compile]
    [--compile-mode MODE] [--out CSV] [--runs-dir DIR]

The GPT workload's training throughput (tokens/s per rank) and MFU, DDP against FSDP2: the project
trainer runs each parallelism --repeats times, interleaved, each run in a process of its own (under
torchrun with several ranks) on a token file made for the benchmark; the median over the repeats of
the runs' steady-state windows (summary.json) is reported.

The tokens are random bytes through the `bytes` tokenizer (the only one the token loader knows):
throughput does not depend on what the tokens say, and the model keeps its preset's vocabulary
(gpt2-small: 50304), so its size and FLOPs per token are the preset's; the tokens only use its
first 256 ids. MFU = tokens/s per rank x training FLOPs per token / the device's peak FLOP/s at
the run's precision (analysis.peak_tflops of config/schema.yaml; on a CPU its `cpu` entry, a
placeholder of 0.1 TFLOP/s, so a CPU's MFU is not comparable with a GPU's); the CSV names the
peak's entry and source (`peak_tflops_source`).

The step is compiled by default where a GPU runs it (`--no-compile`: eager; on the CPU eager unless
`--compile`: Inductor's C++ build takes minutes there), as the study's `model.compile` does, in
`--compile-mode`: at one rank and under DDP the model and its loss as one region (no fp32 copy of
the logits outside it), under FSDP2 each block before sharding and the loss on its own
(scalestudy.train.model_loss, scalestudy.train.parallel). The attention is
F.scaled_dot_product_attention (flash on a GPU in bf16) and AdamW's step is fused
(scalestudy.train.optim) in every run. `--micro-batch` runs each rank's batch in chunks of M
sequences (train.micro_batch, gradient accumulation: scalestudy.train.accumulation) with the same
global batch: a GPT-2 small batch that does not fit the GPU in one pass.

On a GPU at issue 51's settings (gpt2-small, bf16, one rank of 16 x 1024 tokens) the run ends with
its targets: DDP at least 42 % MFU, FSDP2 at least 0.95x DDP (TARGETS).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from scalestudy import contract, provenance
from scalestudy.analysis.mfu import find_peak_tflops
from scalestudy.analysis.settings import with_defaults
from scalestudy.benchmark import project, report
from scalestudy.benchmark.measure import median
from scalestudy.benchmark.studyconfig import REPO
from scalestudy.data import tokenize
from scalestudy.plan import runfiles
from scalestudy.progress import setup_logging
from scalestudy.workloads.gpt.presets import PRESETS

log = logging.getLogger("scalestudy.benchmark.lm")

PARALLELISMS = ("ddp", "fsdp")
CORPUS_SEED = 1234
TABLE_COLUMNS = (
    "name",
    "median",
    "unit",
    "ratio",
    "vs",
    "mfu_pct",
    "step_time_s",
    "compile_s",
    "kernel_active_pct",
    "model_state_mib_per_rank",
    "peak_memory_mib",
)
ACTIVITY_COLUMNS = ("kernel_active_pct", "sm_active_pct")  # gpu_activity's, the CSV's
TARGET_STEPS, TARGET_REPEATS = 100, 3  # what issue 51's targets are judged on, at least
TARGETS = (  # issue 51, at its settings only (targets_apply)
    report.Target("GPT-2 small DDP at one rank, MFU %", "lm", "ddp", on="mfu_pct", minimum=42),
    report.Target("GPT-2 small FSDP2 vs DDP at one rank", "lm", "fsdp", minimum=0.95),
)
MIB = 2**20
PEAK_SOURCE = (
    "analysis.peak_tflops[{key}][{precision}] of scalestudy/plan/schema.yaml: the vendor's dense peak "
    "of that math (H100 SXM bf16 989.4: NVIDIA H100 datasheet, without sparsity)"
)
RANK_VARIABLES = frozenset(
    ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")
    + ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS")
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m scalestudy.benchmark.lm",
        description="GPT training throughput (tokens/s per rank) and MFU, DDP vs FSDP2.",
    )
    parser.add_argument("--preset", choices=tuple(PRESETS), default="demo", help="the model")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--precision", choices=("fp32", "bf16"), help="default: bf16 on cuda, fp32 on cpu")
    parser.add_argument("--per-gpu-batch", type=int, default=16, help="sequences per rank and step (16)")
    parser.add_argument(
        "--micro-batch",
        type=int,
        help="sequences per forward/backward pass (gradient accumulation; it divides --per-gpu-batch)",
    )
    parser.add_argument("--steps", type=int, help="measured steps (default: 20 cpu, 100 cuda)")
    parser.add_argument("--warmup", type=int, help="unmeasured steps first (default: 3 cpu, 10 cuda)")
    parser.add_argument("--parallelism", nargs="+", choices=PARALLELISMS, default=list(PARALLELISMS))
    parser.add_argument(
        "--repeats", type=int, default=3, help="runs of each parallelism, interleaved; the median (3)"
    )
    parser.add_argument("--world-size", type=int, default=1, help="ranks (>1: torchrun on this node)")
    parser.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        help="torch.compile the step (model.compile; default: on with a GPU, off on the CPU)",
    )
    parser.add_argument(
        "--compile-mode",
        default="default",
        choices=("default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune"),
        help="torch.compile's mode with --compile (train.compile_mode)",
    )
    parser.add_argument("--out", type=Path, default=REPO / "bench-out" / "lm.csv", help="CSV (atomic)")
    parser.add_argument(
        "--runs-dir", type=Path, help="keep the token data and the runs (summary.json, metrics.csv) here"
    )
    parser.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    args = parser.parse_args(argv)
    for name in ("per_gpu_batch", "micro_batch", "steps", "warmup", "repeats", "world_size"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    if args.runs_dir and args.runs_dir.exists() and any(args.runs_dir.iterdir()):
        parser.error(f"--runs-dir {args.runs_dir} is not empty (its checkpoints would be resumed)")
    cuda = use_cuda(args.device)
    if args.device == "cuda" and not cuda:
        parser.error("--device cuda, but torch sees no CUDA device")
    args.device = "cuda" if cuda else "cpu"
    args.precision = args.precision or ("bf16" if cuda else "fp32")
    args.compile = cuda if args.compile is None else args.compile
    args.steps = args.steps or (100 if cuda else 20)
    args.warmup = args.warmup or (10 if cuda else 3)
    return args


def use_cuda(device: str) -> bool:
    import torch

    return device != "cpu" and torch.cuda.is_available()


def seq_len(preset: str) -> int:
    return PRESETS[preset]["seq_len"]


def write_token_data(folder: Path, args: argparse.Namespace) -> Path:
    """Random bytes -> the `bytes` tokenizer's packed splits: enough training windows for every
    step of every rank, and one evaluation batch per rank of test windows."""
    window = seq_len(args.preset) + 1
    sequences_per_step = args.per_gpu_batch * args.world_size
    train_tokens = (args.warmup + args.steps) * sequences_per_step * window + window
    test_tokens = sequences_per_step * window
    folder.mkdir(parents=True, exist_ok=True)
    corpus = folder / "corpus.bin"
    rng = np.random.default_rng(CORPUS_SEED)
    rng.integers(0, 256, train_tokens + test_tokens, dtype=np.uint8).tofile(corpus)
    test_fraction = test_tokens / (train_tokens + test_tokens)
    tokenize.tokenize(corpus, folder / "packed", test_fraction, "bytes", seq_len=seq_len(args.preset))
    return folder / "packed"


def run_config(args: argparse.Namespace, parallelism: str, data_dir: Path, checkpoints: Path) -> dict:
    """The trainer's run config of one LM run, checked against the trainer's own rules (RunConfigError)."""
    steps = args.warmup + args.steps
    global_batch = args.per_gpu_batch * args.world_size
    return project.checked(
        {
            "workload": "gpt",
            "gpt": {"preset": args.preset},
            "parallelism": parallelism,
            "data_dir": str(data_dir),
            "checkpoint_dir": str(checkpoints),
            "device": args.device,
            "precision": args.precision,
            "world_size": args.world_size,
            "per_gpu_batch": args.per_gpu_batch,
            **({"micro_batch": args.micro_batch} if args.micro_batch else {}),
            "global_batch": global_batch,
            "base_batch": global_batch,
            "epochs": 1,
            "lr": 6e-4,  # AdamW's (nanoGPT's GPT-2 rate), not the ResNet's SGD default; no effect on speed
            "weight_decay": 0.1,
            "max_steps_per_epoch": steps,
            "eval_max_batches": 1,
            "checkpoint_every_steps": 0,
            "measure_warmup_steps": args.warmup,
            "measure_steps": args.steps,
            "measure_intervals": min(4, args.steps),
            "log_every_steps": max(1, steps // 5),
            "monitor_interval_s": 1.0,
            "compile": args.compile,
            **({"compile_mode": args.compile_mode} if args.compile else {}),
        }
    )


def run_trainer(config: dict[str, Any], out_dir: Path, log_level: str) -> dict[str, Any]:
    """One training run in a process of its own (under torchrun with several ranks): its summary.json's
    results, its graph breaks and its GPU's activity (gpu_activity). Its own process: the peak memory
    (the CPU's peak RSS, CUDA's peak allocation) is the run's, not that of the runs before it."""
    argv = ["--run-config-json", json.dumps(config), "--out-dir", str(out_dir), "--log-level", log_level]
    ranks = config["world_size"]
    launcher = [sys.executable]
    if ranks > 1:
        launcher += ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks)]
    command = [*launcher, "-m", "scalestudy.train", *argv]
    code = subprocess.run(command, cwd=REPO, env=single_node_environment(), check=False).returncode
    if code != 0:
        raise RuntimeError(f"the {config['parallelism']} run failed with exit code {code} (its log above)")
    summary = json.loads((out_dir / runfiles.SUMMARY).read_text())
    results = {
        **summary["results"],
        "graph_breaks": summary["provenance"]["graph_breaks"],
        **gpu_activity(out_dir),
    }
    if not results["window_filled"]:
        raise RuntimeError(f"the {config['parallelism']} run did not fill its measurement window")
    if results.get("contended"):
        raise RuntimeError(f"the {config['parallelism']} run shared its GPUs: {results['contention']}")
    return results


def gpu_activity(run_dir: Path) -> dict[str, float]:
    """Rank 0's GPU over the run's measurement window (scalestudy.analysis.monitor_window): the share
    of time any kernel ran (NVML) and of busy SMs (GPM), in %; NaN on the CPU. A step whose host
    cannot queue its kernels as fast as the GPU runs them leaves the GPU idle between them: a
    kernel-active share well under 100 % says the step is bound by the host, not the GPU."""
    from scalestudy.analysis import monitor_window

    samples, _ = monitor_window.load([run_dir / runfiles.GPU_MONITOR])
    table = monitor_window.per_gpu(samples)
    first = table.iloc[0] if len(table) else {}
    return {column: float(first.get(column, math.nan)) for column in ACTIVITY_COLUMNS}


def single_node_environment() -> dict[str, str]:
    """This environment without a launcher's rank variables (torchrun's, or srun's when the benchmark
    itself runs in a Slurm job): the benchmark launches its ranks itself, on this node."""
    return {key: value for key, value in os.environ.items() if key not in RANK_VARIABLES}


def peak_tflops(results: dict[str, Any]) -> tuple[float, str | None]:
    """The analysis defaults' peak for the run's device and effective precision (NaN: none known)."""
    peaks = with_defaults({})["peak_tflops"]
    return find_peak_tflops(peaks, results["device_name"], results["device"], results["precision_effective"])


def result_row(args: argparse.Namespace, repeats: list[dict[str, Any]]) -> dict:
    """The columns of one parallelism's runs next to report.records' own: what ran, where, its
    memory (the largest of the repeats) and the repeats' median rates."""
    first = repeats[0]
    peak_memory = max(results["peak_memory_bytes"] for results in repeats)
    model_state = max(results["model_state_bytes_per_rank"] for results in repeats)
    return {
        "parallelism": first["parallelism"],
        "preset": args.preset,
        "precision": args.precision,
        "precision_effective": first["precision_effective"],
        "device": first["device"],
        "device_name": first["device_name"],
        "world_size": first["world_size"],
        "per_gpu_batch": first["per_gpu_batch"],
        "micro_batch": args.micro_batch,
        "seq_len": seq_len(args.preset),
        "parameters": first["parameters"],
        "train_flops_per_token": first["train_flops_per_image"],
        "tokens_per_s": median([results["images_per_s"] for results in repeats]),
        "step_time_s": median([results["step_time_s"] for results in repeats]),
        "compile_s": median([results["compile_s"] for results in repeats]) if args.compile else None,
        "graph_breaks": max(results["graph_breaks"] for results in repeats) if args.compile else None,
        "resharded_after_forward": (first["fsdp_options"] or {}).get("resharded_after_forward"),
        **{column: median([results[column] for results in repeats]) for column in ACTIVITY_COLUMNS},
        "warmup_steps": first["warmup_steps"],
        "measured_steps": first["measured_steps"],
        "peak_memory_bytes": peak_memory,
        "peak_memory_source": first["peak_memory_source"],
        "peak_memory_mib": peak_memory / MIB,
        "model_state_bytes_per_rank": model_state,
        "model_state_mib_per_rank": model_state / MIB,
        "final_train_loss": first["final_train_loss"],
    }


def table(args: argparse.Namespace, runs: dict[str, list[dict[str, Any]]]) -> list[dict]:
    """report.records of the runs (the median tokens/s per rank over the repeats, the ratio to the
    first parallelism, MFU against the device's peak), with every parallelism's own columns. All
    runs share the device and precision."""
    first = next(iter(runs))
    peak, peak_key = peak_tflops(runs[first][0])
    settings = (
        f"{args.preset}, {args.precision}, {args.world_size} x {args.per_gpu_batch} x {seq_len(args.preset)}"
        " tokens a step"
    )
    rows = [
        report.Row(
            "lm",
            parallelism,
            "tokens/s per rank",
            tuple(results["images_per_s_per_gpu"] for results in repeats),
            settings,
            baseline=first if parallelism != first else None,
            flops_per_item=repeats[0]["train_flops_per_image"],
        )
        for parallelism, repeats in runs.items()
    ]
    context = {
        "peak_tflops": peak,
        "peak_tflops_key": peak_key,
        "peak_tflops_source": PEAK_SOURCE.format(
            key=peak_key, precision=runs[first][0]["precision_effective"]
        ),
        "compile": args.compile,
        "compile_mode": args.compile_mode if args.compile else None,
        **provenance.git_state(),
        "torch": torch_version(),
        "cores": os.cpu_count(),
        "load_1m_start": args.load_1m_start,
        "load_1m_end": round(os.getloadavg()[0], 2),
    }
    table_records = report.records(rows, peak * 1e12 if math.isfinite(peak) else None, context)
    return [
        {**record, **result_row(args, repeats)}
        for record, repeats in zip(table_records, runs.values(), strict=True)
    ]


def torch_version() -> str:
    import torch

    return torch.__version__


def measure(args: argparse.Namespace) -> list[dict]:
    """Every parallelism `repeats` times, interleaved (ddp, fsdp, ddp, ...): a machine's drift
    (other jobs, clocks) falls on all of them alike."""
    runs: dict[str, list[dict[str, Any]]] = {parallelism: [] for parallelism in args.parallelism}
    total = args.repeats * len(args.parallelism)
    for parallelism in args.parallelism:  # a run config the trainer would refuse fails here, at once
        run_config(args, parallelism, Path("data"), Path("checkpoints"))
    with tempfile.TemporaryDirectory(prefix="scalestudy-lm-bench-") as tmp:
        workdir = args.runs_dir or Path(tmp)
        data_dir = write_token_data(workdir, args)
        for repeat in range(args.repeats):
            for parallelism in args.parallelism:
                log.info(
                    "run %d of %d: %s, preset %s, %s, %d rank(s) x %d sequences, %d + %d steps",
                    sum(map(len, runs.values())) + 1,
                    total,
                    parallelism,
                    args.preset,
                    args.precision,
                    args.world_size,
                    args.per_gpu_batch,
                    args.warmup,
                    args.steps,
                )
                folder = workdir / f"{parallelism}-{repeat}"
                config = run_config(args, parallelism, data_dir, folder / "ckpt")
                runs[parallelism].append(run_trainer(config, folder / "run", args.log_level))
    return table(args, runs)


def targets_apply(args: argparse.Namespace, rows: list[dict]) -> bool:
    """Issue 51's settings: GPT-2 small in bf16 on a GPU, one rank of 16 sequences in one pass."""
    settings = (args.preset, args.precision, args.world_size, args.per_gpu_batch, args.micro_batch)
    return rows[0]["device"] == "cuda" and settings == ("gpt2-small", "bf16", 1, 16, None)


def target_lines(args: argparse.Namespace, rows: list[dict]) -> str | None:
    """Issue 51's verdicts where its settings ran (targets_apply); not judged on fewer measured steps
    or repeats than it asks for (TARGET_STEPS, TARGET_REPEATS, both parallelisms)."""
    if not targets_apply(args, rows):
        return None
    short = args.steps < TARGET_STEPS or args.repeats < TARGET_REPEATS or len(rows) < len(PARALLELISMS)
    if short:
        return (
            f"issue 51's targets not judged: they need {TARGET_STEPS} measured steps and {TARGET_REPEATS} "
            f"interleaved repeats of ddp and fsdp (ran {args.steps} steps x {args.repeats} of "
            f"{' '.join(args.parallelism)})"
        )
    return report.format_checks(report.check_targets(TARGETS, rows))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup_logging(getattr(logging, args.log_level))
    args.parallelism = list(dict.fromkeys(args.parallelism))
    args.load_1m_start = round(os.getloadavg()[0], 2)  # a shared machine: others' load, in the CSV
    try:
        rows = measure(args)
    except project.runconfig.RunConfigError as error:
        log.error("the trainer would refuse the run config: %s", error)
        return contract.EXIT_BAD_CONFIG
    except RuntimeError as error:
        log.error("%s", error)
        return 1
    print(report.format_table(rows, TABLE_COLUMNS))
    verdicts = target_lines(args, rows)
    if verdicts:
        print(verdicts)
    if rows[0]["device"] == "cpu":
        print("MFU on a CPU is against the placeholder peak analysis.peak_tflops.cpu (not a measured rate)")
    report.write_csv(args.out, rows)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
