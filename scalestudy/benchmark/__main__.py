"""python -m scalestudy.benchmark [--device auto|cpu|cuda] [--width W] [--batch B] [--repeats R] [--out CSV]
python -m scalestudy.benchmark dag [--configfile config/bench-grid.yaml] [--repeats R] [--profile] [--out CSV]
python -m scalestudy.benchmark.lm [--preset demo|gpt2-small] ...: the GPT's tokens/s and MFU, DDP vs FSDP2
(also as `python -m scalestudy.benchmark lm ...`)

The first form measures, in one run on this machine: the matmul rate (the MFU denominator), the data
pipeline (project TensorLoader vs DataLoader + PIL), training (project trainer vs the reference
trainer) and the per-job fixed cost; the second times `snakemake --dry-run` of a large grid.
Medians of --repeats samples after warm-up; a table with ratios on stdout, every sample's
median/min/max in the CSV. docs/guide/benchmarks.md has the numbers and the targets.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
from pathlib import Path

from scalestudy import contract
from scalestudy.benchmark.report import (
    Row,
    Target,
    check_targets,
    format_checks,
    format_table,
    records,
    write_csv,
)
from scalestudy.benchmark.studyconfig import DEMO_CONFIG, REPO, STUDY_CONFIG
from scalestudy.plan import schema

SECTIONS = ("matmul", "pipeline", "training", "fixed_cost")
CPU_TARGETS = (
    Target("data pipeline vs DataLoader + PIL", "pipeline", "project TensorLoader", minimum=10),
    Target("trainer vs reference trainer (fp32)", "training", "project trainer fp32", minimum=1.2),
    Target(
        "trainer with channels_last vs reference trainer (fp32)",
        "training",
        "project trainer fp32 channels_last",
        minimum=1.2,
    ),
)
GPU_TARGETS = (
    Target("trainer bf16 images/s per GPU", "training", "project trainer bf16", on="value", minimum=40_000),
    Target(  # the study's step (compiled where its config compiles) against the plain trainer (issue 51)
        "trainer bf16 vs reference trainer (fp32, torch's defaults: TF32 convolutions)",
        "training",
        "project trainer bf16",
        minimum=3,
    ),
)
DAG_TARGET = Target(
    "snakemake --dry-run of the grid (s)", "dag", "snakemake --dry-run", on="value", maximum=10
)


def parse_run_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m scalestudy.benchmark",
        description=__doc__.split("\n\n")[1],
        epilog="The dry-run benchmark: python -m scalestudy.benchmark dag --help",
    )
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--width", type=int, help="model width (default: the config's on cpu, 64 on cuda)")
    parser.add_argument("--batch", type=int, help="batch per step (default: 128 on cpu, 512 on cuda)")
    parser.add_argument(
        "--repeats", type=positive, default=5, help="samples per measurement after warm-up (1: a quick check)"
    )
    parser.add_argument("--out", type=Path, default=REPO / "bench-out" / "benchmark.csv", help="CSV (atomic)")
    parser.add_argument(
        "--config",
        type=Path,
        help="study config of the project runs (default: demo.yaml cpu, config.yaml cuda)",
    )
    parser.add_argument("--steps", type=int, help="training steps per sample (default: 20 cpu, 100 cuda)")
    parser.add_argument(
        "--precisions", help="project trainer precisions (default: fp32 cpu; on cuda the schema's but tf32)"
    )
    parser.add_argument(
        "--channels-last",
        action=argparse.BooleanOptionalAction,
        help="project trainer memory format (default: the config's; on cpu with it off, both are measured)",
    )
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"subset of {','.join(SECTIONS)}")
    return parser.parse_args(argv)


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text}")
    return value


def parse_dag_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m scalestudy.benchmark dag",
        description="Times `snakemake --dry-run --nolock` of a large grid in this repository.",
    )
    parser.add_argument("--configfile", type=Path, default=REPO / "config" / "bench-grid.yaml")
    parser.add_argument("--repeats", type=positive, default=3)
    parser.add_argument(
        "--profile", action="store_true", help="also one dry-run under cProfile: the hotspots"
    )
    parser.add_argument("--out", type=Path, default=REPO / "bench-out" / "dag.csv")
    return parser.parse_args(argv)


def use_cuda(device: str) -> bool:
    import torch

    return device == "cuda" or (device == "auto" and torch.cuda.is_available())


def default_config(device: str) -> Path:
    """The demo study on the CPU; on a GPU the real study (its step-timing and logging intervals)."""
    return STUDY_CONFIG if use_cuda(device) else DEMO_CONFIG


def gpu_precisions() -> list[str]:
    """The precisions the study config may ask for (the schema's enum) but tf32, which is fp32 with
    TF32 math (the reference's own on a GPU)."""
    return [precision for precision in schema.definition("precision")["enum"] if precision != "tf32"]


def choose_settings(args: argparse.Namespace, config: dict):
    import torch

    from scalestudy.benchmark.pipelines import cpu_count
    from scalestudy.benchmark.suite import Settings, project_variants

    cuda = use_cuda(args.device)
    precisions = args.precisions.split(",") if args.precisions else gpu_precisions() if cuda else ["fp32"]
    config_channels_last = config["model"]["channels_last"]
    return Settings(
        device=torch.device("cuda" if cuda else "cpu"),
        width=_given(args.width, 64 if cuda else config["model"]["width"]),
        batch=_given(args.batch, 512 if cuda else 128),
        repeats=args.repeats,
        steps=_given(args.steps, 100 if cuda else 20),
        epochs=3,
        pipeline_batches=200 if cuda else 40,
        variants=project_variants(
            precisions, args.channels_last, config_channels_last, "cuda" if cuda else "cpu"
        ),
        matmul_dtype=torch.bfloat16 if cuda else torch.float32,
        matmul_size=8192 if cuda else 2048,
        matmul_iterations=20 if cuda else 4,
        workers=cpu_count(),
    )


def _given(value, default):
    """The command line's value when given (0 included: the trainer's rules refuse it), else the default."""
    return default if value is None else value


def machine_context(settings) -> dict:
    import torch

    return {
        "device": settings.device.type,
        "device_name": device_name(settings.device),
        "cpu_model": cpu_model(),
        "cores": settings.workers,
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "width": settings.width,
        "batch": settings.batch,
        "load_1m_start": round(os.getloadavg()[0], 2),
    }


DEVICE_PROBE = "import torch; print(torch.cuda.get_device_name())"


def device_name(device, python: str = sys.executable) -> str:
    """The GPU's name from a fresh Python (this process starts no CUDA before its trainers have
    measured: suite.training_rows), or the CPU's."""
    import subprocess

    if device.type != "cuda":
        return cpu_model()
    result = subprocess.run([python, "-c", DEVICE_PROBE], capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"python -m scalestudy.benchmark: no CUDA device: {result.stderr.strip()[-300:]}")
    return result.stdout.strip()


def cpu_model() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    models = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    return models[0] if models else platform.machine()


# The sections in the order they run: the trainers (each in a process of its own) first, while this
# process has no CUDA context that their GPU monitors would list on the GPU; then the sections that
# measure in this process. The table keeps the order of SECTIONS.
RUN_ORDER = ("training", "fixed_cost", "matmul", "pipeline")


def run_sections(settings, sections: list[str], config: dict) -> list[Row]:
    from scalestudy.benchmark import pipelines, suite

    measure = {
        "training": lambda data_dir, workdir: suite.training_rows(settings, config, data_dir, workdir),
        "fixed_cost": lambda data_dir, workdir: suite.fixed_cost_rows(settings, config, data_dir, workdir),
        "matmul": lambda data_dir, workdir: suite.matmul_rows(settings),
        "pipeline": lambda data_dir, workdir: suite.pipeline_rows(settings, data_dir),
    }
    rows: dict[str, list[Row]] = {}
    with tempfile.TemporaryDirectory(prefix="scalestudy-bench-") as tmp:
        workdir = Path(tmp)
        suite.run_configs(settings, config, workdir / "data", sections)  # refused ones fail here, at once
        batches = max(settings.steps, settings.pipeline_batches)
        per_class = pipelines.images_per_class(batches, settings.batch, settings.workers)
        data_dir = pipelines.write_packed(workdir / "data", per_class, 10)
        for name in (name for name in RUN_ORDER if name in sections):
            rows[name] = measure[name](data_dir, workdir)
    return [row for name in SECTIONS for row in rows.get(name, [])]


def matmul_peak(rows: list[Row]) -> float | None:
    """FLOP/s of the matmul row (its unit is TFLOP/s), or None if it was not measured."""
    return next((row.median * 1e12 for row in rows if row.section == "matmul"), None)


def publish(rows: list[Row], context: dict, targets, out: Path) -> list[dict]:
    table = records(rows, matmul_peak(rows), {**context, "load_1m_end": round(os.getloadavg()[0], 2)})
    print(format_table(table))
    print()
    print(format_checks(check_targets(targets, table)))
    write_csv(out, table)
    print(f"\nwrote {out}")
    return table


def main_run(argv: list[str]) -> int:
    from scalestudy.plan.runconfig import RunConfigError
    from scalestudy.plan.studyconfig import load as load_config

    args = parse_run_args(argv)
    sections = [name for name in args.sections.split(",") if name]
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        raise SystemExit(f"unknown sections {unknown}; choose from {SECTIONS}")
    config = load_config(args.config or default_config(args.device))
    settings = choose_settings(args, config)
    context = machine_context(settings)
    print(", ".join(f"{key}={value}" for key, value in context.items()), flush=True)
    try:
        rows = run_sections(settings, sections, config)
    except RunConfigError as error:
        print(
            f"python -m scalestudy.benchmark: the project trainer would refuse its run config: {error}",
            file=sys.stderr,
        )
        return contract.EXIT_BAD_CONFIG
    publish(rows, context, GPU_TARGETS if settings.device.type == "cuda" else CPU_TARGETS, args.out)
    return 0


def main_dag(argv: list[str]) -> int:
    from scalestudy.benchmark import dag
    from scalestudy.benchmark.measure import interleave
    from scalestudy.plan.studyconfig import load as load_config

    args = parse_dag_args(argv)
    points = dag.count_points(load_config(args.configfile))
    context = {
        "cpu_model": cpu_model(),
        "cores": os.cpu_count(),
        "load_1m_start": round(os.getloadavg()[0], 2),
    }
    outputs: list[str] = []

    def one() -> float:
        seconds, output = dag.time_dry_run(args.configfile)
        outputs.append(output)
        return seconds

    samples = interleave({"dry-run": one}, args.repeats)["dry-run"]
    jobs = dag.planned_jobs(outputs[-1])
    settings = f"{points} grid points, {jobs} jobs planned, {args.configfile.name}"
    rows = [Row("dag", "snakemake --dry-run", "s", tuple(samples), settings)]
    publish(rows, context, [DAG_TARGET], args.out)
    if args.profile:
        print_profile(args.configfile, args.out.with_suffix(".prof"))
    return 0


def print_profile(configfile: Path, stats_path: Path) -> None:
    from scalestudy.benchmark import dag

    stats = dag.profile_dry_run(configfile, stats_path)
    print(f"\ncProfile of one dry-run ({stats_path}): the workflow's own code, by cumulative time")
    for name, calls, own, cumulative in dag.workflow_hotspots(stats):
        print(f"  {cumulative:7.3f} s cum  {own:7.3f} s own  {calls:8d} calls  {name}")
    print("\nall functions, by own time")
    for name, calls, own, cumulative in dag.top_functions(stats):
        print(f"  {own:7.3f} s own  {cumulative:7.3f} s cum  {calls:8d} calls  {name}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["dag"]:
        return main_dag(argv[1:])
    if argv[:1] == ["lm"]:
        from scalestudy.benchmark import lm

        return lm.main(argv[1:])
    return main_run(argv)


if __name__ == "__main__":
    sys.exit(main())
