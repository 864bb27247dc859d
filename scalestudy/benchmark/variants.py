"""python -m scalestudy.benchmark.variants [--device auto|cpu|cuda] [--variants NAME,...]
    [--batches 256,512,1024] [--repeats R] [--steps N] [--warmup W] [--budget-s S] [--out CSV]

The project trainer's step variants side by side (issue 42): eager against torch.compile in its modes,
the optimizer's kernels, the memory format and the precision, at several per-GPU batches; and the
eager step captured whole as one CUDA graph (`captured`: scalestudy.benchmark.captured, a harness of
the trainer's step rather than the trainer; issue 51 decides between it and `compiled-cudagraphs`
by this table). Every
sample is one training run in a fresh process (scalestudy.benchmark.project.spawn_fresh), so this
process never holds a CUDA context and each run's steady-state window (summary.json) is its own.
The runs go in rounds (every variant at every batch once, then again), so a drift of the machine
falls on all of them alike; the compiled runs share one TorchInductor cache, so only a cell's first
compiled run pays the whole compile.

`--budget-s` bounds the wall time: before each run the time it will take is estimated (the last
run of the same cell, else of the same variant, else a first guess); a run that would end past the
budget is not started, and the table says how many repeats each cell got. Per cell: the mean of the
repeats' img/s, their standard deviation and coefficient of variation, min and max, the ratio of
the means to the baseline variant at the same batch, and that ratio's noise (2 standard errors,
from both cells' cv; with one repeat, from the runs' own window intervals): a change is told from
noise where |ratio - 1| exceeds it. The CSV has one line per cell, plus one per sample
(`kind=sample`). docs/guide/benchmarks.md, "Step variants", explains the table;
docs/measurements/ keeps the numbers.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scalestudy import contract
from scalestudy.benchmark import captured, project
from scalestudy.benchmark.report import format_table, write_csv
from scalestudy.benchmark.studyconfig import REPO
from scalestudy.plan import schema
from scalestudy.progress import setup_logging

log = logging.getLogger("scalestudy.benchmark.variants")

# name -> the run-config overrides on top of the study config's model and train settings
VARIANTS: dict[str, dict[str, Any]] = {
    "eager": {"compile": False},
    "compiled": {"compile": True, "compile_mode": "default"},
    "compiled-cudagraphs": {"compile": True, "compile_mode": "reduce-overhead"},
    "compiled-autotune": {"compile": True, "compile_mode": "max-autotune-no-cudagraphs"},
    "foreach": {"compile": False, "optimizer_impl": "foreach"},
    "forloop": {"compile": False, "optimizer_impl": "forloop"},
    "nchw": {"compile": False, "channels_last": False},
    "tf32": {"compile": False, "precision": "tf32"},
    # the eager step captured whole by torch.cuda.graph, in its own harness (scalestudy.benchmark.captured)
    "captured": {"compile": False},
}
HARNESSES = {"captured": captured.spawn_fresh}  # variants not run by the trainer itself
BASELINE = "eager"
clock = time.perf_counter  # the budget's clock (the tests' stand-in replaces it)
DEFAULTS = {  # device -> the command's defaults
    "cuda": {
        "variants": "eager,compiled,compiled-cudagraphs,foreach",
        "batches": "256,512,1024",
        "repeats": 2,
        "steps": 100,
        "warmup": 30,
        "width": 64,
        "precision": "bf16",
        "images": 50_000,
    },
    "cpu": {
        "variants": "eager,foreach",
        "batches": "16",
        "repeats": 2,
        "steps": 4,
        "warmup": 2,
        "width": 8,
        "precision": "fp32",
        "images": 320,
    },
}
# A run's first guess, by device and compile. On an H200 (2026-11-28) an eager run at batch 512 took
# 12-15 s in all, and a compiled one on an H100 compiled in 21 s: 40 s. The guess it replaced (60 s)
# left the compiled variants unstarted in a 90 s budget that held them.
FIRST_GUESS_S = {"cuda": {False: 20.0, True: 40.0}, "cpu": {False: 15.0, True: 90.0}}
TABLE = ("variant", "batch", "repeats", "mean", "sd", "cv_pct", "min", "max", "ratio", "noise", "compile_s")


@dataclass
class Cell:
    """One variant at one batch: its run config and what its runs gave."""

    variant: str
    batch: int
    run: dict[str, Any]
    rates: list[float] = field(default_factory=list)
    window_cvs: list[float] = field(default_factory=list)
    walls: list[float] = field(default_factory=list)
    compile_s: list[float] = field(default_factory=list)
    step_ms: list[float] = field(default_factory=list)
    peak_mib: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    device_name: str = ""

    def add(self, trained: project.TrainerRun) -> None:
        results = trained.summary["results"]
        self.rates.append(trained.images_per_s)  # raises for an unfilled window or a shared GPU
        self.window_cvs.append(float(results.get("images_per_s_cv") or 0.0))
        self.walls.append(trained.wall_s)
        self.compile_s.append(float(results.get("compile_s") or 0.0))
        self.step_ms.append(1000 * float(results["step_time_s"]))
        self.peak_mib.append(float(results.get("peak_memory_bytes") or 0) / 2**20)
        self.device_name = results.get("device_name", "")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m scalestudy.benchmark.variants",
        description="The project trainer's step variants side by side, each run a fresh process.",
    )
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument(
        "--config", type=Path, help="study config (default: config/config.yaml on cuda, demo)"
    )
    parser.add_argument(
        "--variants", help=f"comma-separated, from {', '.join(VARIANTS)}; the first is the baseline"
    )
    parser.add_argument("--batches", help="comma-separated per-GPU batches")
    parser.add_argument("--repeats", type=int, help="runs of every cell, in rounds")
    parser.add_argument("--steps", type=int, help="steps in each run's measurement window")
    parser.add_argument("--warmup", type=int, help="steps before the window (compile, cudnn autotuning)")
    parser.add_argument("--width", type=int, help="ResNet base width (64: ResNet-18)")
    parser.add_argument("--precision", choices=schema.definition("precision")["enum"])
    parser.add_argument("--budget-s", type=float, default=math.inf, help="no run starts that would end later")
    parser.add_argument("--out", type=Path, default=REPO / "bench-out" / "variants.csv", help="CSV (atomic)")
    parser.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    args = parser.parse_args(argv)
    args.device = "cuda" if args.device == "cuda" or (args.device == "auto" and cuda_present()) else "cpu"
    for key, value in DEFAULTS[args.device].items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    args.variants = [name for name in dict.fromkeys(args.variants.split(",")) if name]
    unknown = [name for name in args.variants if name not in VARIANTS]
    if unknown or not args.variants:
        parser.error(
            f"--variants: unknown {', '.join(unknown) or '(none given)'}; known: {', '.join(VARIANTS)}"
        )
    try:
        args.batches = [int(text) for text in str(args.batches).split(",") if text]
    except ValueError:
        parser.error(f"--batches must be comma-separated integers, got {args.batches!r}")
    for name in ("repeats", "steps", "warmup", "width"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if not args.batches or min(args.batches) < 1:
        parser.error(f"--batches must be positive integers, got {args.batches}")
    return args


def cuda_present() -> bool:
    """A GPU without initialising CUDA here (nvidia-smi lists one): this process stays context-free."""
    import shutil
    import subprocess

    if not shutil.which("nvidia-smi"):
        return False
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
    return listed.returncode == 0 and "GPU " in listed.stdout


def data_for(args: argparse.Namespace, workdir: Path) -> tuple[Path, int]:
    """Synthetic CIFAR-10-format data for every batch, and the images in it."""
    from scalestudy.benchmark.pipelines import write_packed

    per_class = max(math.ceil(args.images / 10), math.ceil(max(args.batches) / 10))
    return write_packed(workdir / "data", per_class, 2), 10 * per_class


def cells(args: argparse.Namespace, config: dict, data_dir: Path, images: int, cache: Path) -> list[Cell]:
    """Every (batch, variant) with its run config, checked against the trainer's rules before any run.

    A run lasts the epochs that hold warm-up + window (the window goes on across epoch ends, their
    evaluation of one batch paused out)."""
    made = []
    for batch in args.batches:
        per_epoch = max(1, images // batch)
        steps = args.warmup + args.steps
        settings = {
            "per_gpu_batch": batch,
            "width": args.width,
            "precision": args.precision,
            "device": args.device,
            "epochs": math.ceil(steps / per_epoch),
            "max_steps_per_epoch": per_epoch,
            "measure_warmup_steps": args.warmup,
            "measure_steps": args.steps,
            "measure_intervals": min(4, args.steps),
            "measure_seconds": None,
            "checkpoint_every_steps": 10**9,
            "log_every_steps": 0,
            "step_timing_every": 0,
            "inductor_cache_dir": str(cache),
        }
        for variant in args.variants:
            run = project.run_config(config, data_dir, "unused", **{**settings, **VARIANTS[variant]})
            made.append(Cell(variant, batch, run))
    return made


def compiles(cell: Cell) -> bool:
    """The cell's runs compile (torch.compile) or capture (a harness's CUDA graph) before measuring."""
    return bool(cell.run["compile"]) or cell.variant in HARNESSES


def estimate_s(cell: Cell, every: list[Cell], device: str) -> float:
    """The seconds the next run of `cell` will take: its own last run, else the variant's last at
    another batch, else a first guess by device and compile."""
    if cell.walls:
        return cell.walls[-1]
    same = [c.walls[-1] for c in every if c.variant == cell.variant and c.walls]
    return max(same) if same else FIRST_GUESS_S[device][compiles(cell)]


def measure(args: argparse.Namespace, todo: list[Cell], workdir: Path, start: float) -> list[str]:
    """The rounds, within the budget; the runs not started, as lines to print."""
    skipped = []
    for round_index in range(args.repeats):
        for cell in todo:
            if cell.errors:
                continue
            elapsed = clock() - start
            guess = estimate_s(cell, todo, args.device)
            if elapsed + guess > args.budget_s:
                skipped.append(f"{cell.variant}/{cell.batch} round {round_index + 1} (~{guess:.0f} s)")
                continue
            log.info("round %d: %s at batch %d", round_index + 1, cell.variant, cell.batch)
            try:
                cell.add(HARNESSES.get(cell.variant, project.spawn_fresh)(cell.run, workdir))
            except RuntimeError as error:
                cell.errors.append(str(error).strip().splitlines()[-1][:300])
                log.warning("%s at batch %d failed: %s", cell.variant, cell.batch, cell.errors[-1])
    return skipped


def spread(values: list[float]) -> tuple[float, float]:
    """(mean, sample standard deviation; 0 for one value)."""
    mean = statistics.fmean(values)
    return mean, statistics.stdev(values) if len(values) > 1 else 0.0


def relative_error(cell: Cell) -> float:
    """The standard error of the cell's mean over the mean: from the repeats' spread, or with one
    repeat from the run's own window intervals (a floor: a process's run-to-run spread is larger)."""
    mean, sd = spread(cell.rates)
    if len(cell.rates) > 1:
        return sd / mean / math.sqrt(len(cell.rates))
    return cell.window_cvs[0] if cell.window_cvs else math.nan


def rows(todo: list[Cell], baseline: str, context: dict) -> list[dict]:
    base = {cell.batch: cell for cell in todo if cell.variant == baseline}
    out = []
    for cell in todo:
        row: dict[str, Any] = {"kind": "cell", "variant": cell.variant, "batch": cell.batch}
        row["repeats"] = len(cell.rates)
        if cell.rates:
            mean, sd = spread(cell.rates)
            reference = base.get(cell.batch)
            has_base = reference is not None and reference.rates and reference is not cell
            noise = 2 * math.hypot(relative_error(cell), relative_error(reference)) if has_base else None
            row |= {
                "mean": mean,
                "sd": sd,
                "cv_pct": 100 * sd / mean,
                "min": min(cell.rates),
                "max": max(cell.rates),
                "ratio": mean / spread(reference.rates)[0] if has_base else None,
                "noise": noise,
                # compiled: torch.compile's seconds; captured: the capture's
                "compile_s": statistics.fmean(cell.compile_s) if compiles(cell) else None,
                "step_ms": statistics.fmean(cell.step_ms),
                "peak_memory_mib": max(cell.peak_mib),
                "wall_s": statistics.fmean(cell.walls),
            }
        row |= {
            "unit": "img/s",
            "vs": baseline if cell.variant != baseline else None,
            "overrides": ", ".join(f"{k}={v}" for k, v in VARIANTS[cell.variant].items()),
            "error": " | ".join(cell.errors) or None,
            "device_name": cell.device_name,
            **context,
        }
        out.append(row)
    samples = [
        {"kind": "sample", "variant": cell.variant, "batch": cell.batch, "repeat": index, "mean": rate}
        for cell in todo
        for index, rate in enumerate(cell.rates)
    ]
    return out + samples


def markdown(table: list[dict]) -> str:
    """The cells as rows of a Markdown table, for a measurement record (docs/measurements/)."""
    lines = [
        "| variant | batch | img/s (mean +- sd) | repeats | ratio vs eager | noise | device |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for row in (row for row in table if row["kind"] == "cell"):
        rate = f"{row['mean']:,.0f} +- {row['sd']:,.0f}" if row["repeats"] else row.get("error") or "-"
        ratio = f"{row['ratio']:.3f}" if row.get("ratio") is not None else "-"
        noise = f"{row['noise']:.3f}" if row.get("noise") is not None else "-"
        cells = (row["variant"], row["batch"], rate, row["repeats"], ratio, noise, row["device_name"] or "-")
        lines.append("| " + " | ".join(str(cell).replace("|", "/") for cell in cells) + " |")
    return "\n".join(lines)


def context_of(args: argparse.Namespace) -> dict:
    from scalestudy import provenance

    return {
        "device": args.device,
        "precision": args.precision,
        "width": args.width,
        "warmup_steps": args.warmup,
        "window_steps": args.steps,
        **provenance.git_state(),
        "load_1m_start": round(os.getloadavg()[0], 2),
    }


def main(argv: list[str] | None = None) -> int:
    from scalestudy.plan.runconfig import RunConfigError
    from scalestudy.plan.studyconfig import load as load_config

    args = parse_args(argv)
    setup_logging(getattr(logging, args.log_level))
    start = clock()
    config_path = args.config or (REPO / "config" / ("config.yaml" if args.device == "cuda" else "demo.yaml"))
    config = load_config(config_path)
    context = context_of(args)
    with tempfile.TemporaryDirectory(prefix="scalestudy-variants-") as tmp:
        workdir = Path(tmp)
        data_dir, images = data_for(args, workdir)
        try:
            todo = cells(args, config, data_dir, images, workdir / "inductor-cache")
        except RunConfigError as error:
            print(
                f"python -m scalestudy.benchmark.variants: the trainer would refuse: {error}", file=sys.stderr
            )
            return contract.EXIT_BAD_CONFIG
        skipped = measure(args, todo, workdir, start)
    table = rows(todo, args.variants[0], {**context, "load_1m_end": round(os.getloadavg()[0], 2)})
    print(format_table([row for row in table if row["kind"] == "cell"], TABLE))
    print(f"ratio: mean img/s over {args.variants[0]}'s at the same batch; noise: 2 standard errors of it")
    print(markdown(table))
    if skipped:
        print(f"not run within --budget-s {args.budget_s:g}: {'; '.join(skipped)}")
    for row in table:
        if row.get("error"):
            print(f"FAILED {row['variant']}/{row['batch']}: {row['error']}")
    write_csv(args.out, table)
    print(f"wrote {args.out} ({clock() - start:.0f} s)")
    return 1 if any(row.get("error") for row in table) else 0


if __name__ == "__main__":
    sys.exit(main())
