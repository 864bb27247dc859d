"""The verdicts on a one-GPU study run through Snakemake (scripts/gpu_check.sh, step `study`).

    python -m scalestudy.benchmark.studycheck check --results DIR/results --benchmark BENCH.csv
    python -m scalestudy.benchmark.studycheck bench-args --run-dir DIR/results/runs/scaling/strong/w1_r0

`check` prints one verdict a line (PASS / FAIL, the check, the evidence) and exits 1 if any failed:

- `no_overlap`: no two training jobs shared the GPU, from the runs' own records (every summary.json
  under results/runs, smoke and profile: the grid's runs, the smoke tests', the one under ncu): every
  run's GPU monitor sampled its GPU and never saw a foreign compute process on it
  (gpu_monitor.csv's `foreign_processes`), and no two runs' wall-clock spans overlap (a span ends
  at the summary's provenance timestamp, whole seconds, and lasts its `total_time_s`;
  `--overlap-tolerance-s` absorbs the truncation);
- `no_contention`: no point of runs.csv is `contended` (the monitor's evidence, carried into the
  run catalog);
- `strong_vs_benchmark`: the strong-scaling point at one GPU is within `--tolerance` (10 %) of the
  benchmark's project-trainer row at the same settings (precision, per-GPU batch, width,
  channels_last, compile, loader, device): `bench-args` prints the benchmark options that give
  them, from the point's run config;
- `ncu_convolutions`: Nsight Compute ran and its kernel table holds convolution kernels (cuDNN's
  fprop/dgrad/wgrad, implicit GEMMs, Winograd), which the loader's kernels crowded out before;
- `cuda_graphs`: every run whose compiled step should have run as CUDA graphs (summary.json
  cuda_graphs.expected: compiled in a graph mode on a GPU) ran them: none skipped by Inductor
  (scalestudy.train.compiled; a study without such runs passes, saying so).

Then INFO lines, measurements to record rather than verdicts: the benchmark's project trainer (the
study's step: compiled as its config says) against the plain reference trainer, with the GPU target
(`project_vs_reference`, docs/guide/benchmarks.md); and (docs/guide/benchmarks.md, "Energy") the strong 1-GPU
point's energy over its measurement window from NVML's total energy counter against the trapezoid of
its power samples (scalestudy.analysis.energy.counter_vs_integral), and their ratio; where either is
missing, why. Only a ratio beyond a factor of ABSURD_ENERGY_RATIO is a FAIL
(`energy_counter_vs_integral`): one of the two then does not measure the GPU.

A missing file or column fails its check and names it: a check that cannot look has not passed.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import re
import sys
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path

from scalestudy.plan import runconfig, runfiles

FOREIGN = "foreign_processes"
CONTENDED = "contended"
TRAINER_ROW = "project trainer {precision}"
CONVOLUTION = re.compile(r"conv|fprop|dgrad|wgrad|implicit_gemm|winograd", re.IGNORECASE)
STRONG_W1 = "runs/scaling/strong/w1_r0"
ABSURD_ENERGY_RATIO = 2.0  # counter / power integral beyond this (or below its inverse): not the same GPU
# run config key -> the benchmark row's `settings` key (scalestudy.benchmark.suite.describe_run)
SAME_SETTINGS = ("precision", "loader", "channels_last", "compile", "compile_mode")
REFERENCE_ROW = "reference trainer"
PROJECT_VS_REFERENCE_TARGET = 3.0  # issue 51: the study's step at least 3x the plain trainer on a GPU


@dataclass(frozen=True)
class Verdict:
    check: str
    passed: bool
    detail: str

    def line(self) -> str:
        return f"{'PASS' if self.passed else 'FAIL'}  {self.check}: {self.detail}"


def read_rows(path: Path) -> list[dict]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def truthy(text: object) -> bool:
    return str(text).strip().lower() in ("true", "1", "yes")


def number(text: object) -> float | None:
    try:
        return float(str(text).strip())
    except ValueError:
        return None


# --- no_overlap -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunSpan:
    """A training run's folder and its wall-clock span (seconds since the epoch)."""

    folder: Path
    start: float
    end: float


# Where the trainer writes run folders under results/: the grid's points, the smoke tests' runs and
# the profile point's run under ncu (profile/w1/ncu_run/run). Not the copies MLflow keeps as artifacts.
RUN_ROOTS = ("runs", "smoke", "profile")


def run_folders(results: Path) -> list[Path]:
    found = (path.parent for root in RUN_ROOTS for path in (results / root).rglob(runfiles.SUMMARY))
    return sorted(found)


def span_of(folder: Path) -> RunSpan:
    summary = json.loads((folder / runfiles.SUMMARY).read_text())
    end = dt.datetime.fromisoformat(summary["provenance"]["timestamp"]).timestamp()
    return RunSpan(folder, end - float(summary["results"]["total_time_s"]), end)


def foreign_samples(folder: Path) -> tuple[int, int, str | None]:
    """(samples with a foreign process on the run's GPU, the most seen at once, or why unknown)."""
    monitor = folder / runfiles.GPU_MONITOR
    if not monitor.is_file():
        return 0, 0, f"no {runfiles.GPU_MONITOR}"
    rows = read_rows(monitor)
    if not rows:
        return 0, 0, f"{monitor} has no samples (no GPU seen: nothing shows the GPU was the run's alone)"
    if FOREIGN not in rows[0]:
        return 0, 0, f"{monitor} has no {FOREIGN!r} column (a GPU monitor without process counts)"
    counts = [number(row[FOREIGN]) or 0 for row in rows]
    return sum(count > 0 for count in counts), int(max(counts, default=0)), None


def check_overlap(results: Path, tolerance_s: float = 1.0) -> Verdict:
    folders = run_folders(results)
    if not folders:
        return Verdict("no_overlap", False, f"no {runfiles.SUMMARY} under {results}")
    problems = []
    for folder in folders:
        seen, most, unknown = foreign_samples(folder)
        if unknown:
            problems.append(unknown)
        elif seen:
            where = folder.relative_to(results)
            problems.append(f"{where}: {seen} samples with up to {most} foreign processes")
    spans = [span_of(folder) for folder in folders]
    for first, second in combinations(spans, 2):
        shared = min(first.end, second.end) - max(first.start, second.start)
        if shared > tolerance_s:
            problems.append(
                f"{first.folder.relative_to(results)} and {second.folder.relative_to(results)} "
                f"ran {shared:.0f} s at the same time"
            )
    if problems:
        return Verdict("no_overlap", False, "; ".join(problems))
    return Verdict(
        "no_overlap",
        True,
        f"{len(folders)} training runs, no foreign process on their GPU, no two spans overlapping",
    )


# --- no_contention --------------------------------------------------------------------------------


def check_contention(runs_csv: Path) -> Verdict:
    if not runs_csv.is_file():
        return Verdict("no_contention", False, f"no {runs_csv}")
    rows = read_rows(runs_csv)
    if not rows or CONTENDED not in rows[0]:
        return Verdict("no_contention", False, f"{runs_csv} has no rows or no {CONTENDED!r} column")
    contended = [f"{row['stage']}/{row['point']}" for row in rows if truthy(row[CONTENDED])]
    if contended:
        return Verdict("no_contention", False, f"contended: {', '.join(contended)}")
    return Verdict("no_contention", True, f"none of {len(rows)} points contended")


# --- strong_vs_benchmark --------------------------------------------------------------------------


def benchmark_args(run: dict) -> list[str]:
    """The benchmark options that measure the project trainer at a run config's settings."""
    channels = "--channels-last" if run["channels_last"] else "--no-channels-last"
    return ["--precisions", str(run["precision"]), "--batch", str(run["per_gpu_batch"])] + [
        "--width",
        str(run["width"]),
        channels,
    ]


def row_settings(row: dict) -> dict[str, str]:
    """A benchmark row's `settings` ("precision=bf16, loader=tensor, ..., window ...") as a dict."""
    pairs = (item.split("=", 1) for item in row.get("settings", "").split(", ") if "=" in item)
    return {key.strip(): value.strip() for key, value in pairs}


def setting_differences(run: dict, row: dict) -> list[str]:
    """What the benchmark row ran differently from the run config (empty: the same settings)."""
    wanted = {key: str(run[key] if key in run else runconfig.DEFAULTS[key]) for key in SAME_SETTINGS}
    wanted.update(batch=str(run["per_gpu_batch"]), width=str(run["width"]), device=str(run["device"]))
    found = {**row_settings(row), **{key: row.get(key) for key in ("batch", "width", "device")}}
    return [
        f"{key} {found.get(key)} (run: {value})" for key, value in wanted.items() if found.get(key) != value
    ]


def check_strong_point(results: Path, benchmark_csv: Path, tolerance: float = 0.10) -> Verdict:
    name = "strong_vs_benchmark"
    summary_path = results / STRONG_W1 / runfiles.SUMMARY
    if not summary_path.is_file():
        return Verdict(name, False, f"no {summary_path}")
    if not benchmark_csv.is_file():
        return Verdict(name, False, f"no {benchmark_csv}")
    summary = json.loads(summary_path.read_text())
    run, measured = summary["run"], summary["results"].get("images_per_s")
    trainer = TRAINER_ROW.format(precision=run["precision"])
    row = next((row for row in read_rows(benchmark_csv) if row["name"] == trainer), None)
    if row is None:
        return Verdict(name, False, f"{benchmark_csv} has no row {trainer!r}")
    differences = setting_differences(run, row)
    if differences:
        return Verdict(name, False, f"the benchmark ran other settings: {'; '.join(differences)}")
    if not measured:
        return Verdict(name, False, f"{summary_path}: no images_per_s (window not filled?)")
    reference = float(row["median"])
    ratio = float(measured) / reference
    detail = (
        f"{STRONG_W1} {float(measured):,.0f} img/s vs benchmark {trainer!r} {reference:,.0f} img/s "
        f"(median of {row['repeats']}): {ratio:.3f}x, allowed {1 - tolerance:.2f}-{1 + tolerance:.2f}"
    )
    return Verdict(name, abs(ratio - 1) <= tolerance, detail)


# --- ncu_convolutions -----------------------------------------------------------------------------


def check_ncu(profile_dir: Path) -> Verdict:
    name = "ncu_convolutions"
    status_path, kernels_path = profile_dir / "ncu_status.json", profile_dir / "ncu_kernels.csv"
    if not status_path.is_file() or not kernels_path.is_file():
        return Verdict(name, False, f"no {status_path} or {kernels_path}")
    status = json.loads(status_path.read_text())
    if not status.get("ran"):
        return Verdict(name, False, f"ncu did not run: {status.get('reason')}")
    kernels = read_rows(kernels_path)
    convolutions = sorted({row["name"] for row in kernels if CONVOLUTION.search(row["name"])})
    detail = (
        f"{len(convolutions)} convolution kernels in {len(kernels)} launches "
        f"(chosen: {status.get('selection')})"
    )
    if convolutions:
        detail += f"; e.g. {convolutions[0][:80]}"
    return Verdict(name, bool(convolutions), detail)


# --- cuda_graphs ----------------------------------------------------------------------------------


def check_graphs(results: Path) -> Verdict:
    """Every run that expected CUDA graphs ran them (summary.json cuda_graphs.skipped false)."""
    name, expected, skipped = "cuda_graphs", [], []
    for folder in run_folders(results):
        summary = json.loads((folder / runfiles.SUMMARY).read_text())
        graphs = summary["results"].get("cuda_graphs") or {}
        if graphs.get("expected"):
            expected.append(folder)
            if graphs.get("skipped"):
                why = graphs.get("skip_reasons") or f"{graphs.get('skips')} skipped, no reason logged"
                skipped.append(f"{folder.relative_to(results)}: {why}")
    if skipped:
        return Verdict(
            name,
            False,
            f"{len(skipped)} of {len(expected)} runs without their CUDA graphs: " + "; ".join(skipped),
        )
    if not expected:
        return Verdict(
            name, True, "no run expected CUDA graphs (eager, a mode without graphs, or not on a GPU)"
        )
    return Verdict(name, True, f"all {len(expected)} runs that expected CUDA graphs ran them (no skip)")


# --- project_vs_reference (printed) ----------------------------------------------------------------


def project_vs_reference(results: Path, benchmark_csv: Path) -> str:
    """The INFO line of the benchmark's project trainer row at the strong point's precision against
    the reference trainer's, and the GPU target."""
    name = "project_vs_reference"
    try:
        run = json.loads((results / STRONG_W1 / runfiles.SUMMARY).read_text())["run"]
        rows = {row["name"]: row for row in read_rows(benchmark_csv)}
    except (OSError, ValueError, KeyError) as error:
        return f"INFO  {name}: not compared: {error}"
    project_row = TRAINER_ROW.format(precision=run["precision"])
    if project_row not in rows or REFERENCE_ROW not in rows:
        return f"INFO  {name}: not compared: {benchmark_csv} has no {project_row!r} or {REFERENCE_ROW!r} row"
    ours, theirs = float(rows[project_row]["median"]), float(rows[REFERENCE_ROW]["median"])
    ratio = ours / theirs
    target = PROJECT_VS_REFERENCE_TARGET
    return (
        f"INFO  {name}: {project_row!r} {ours:,.0f} img/s vs {REFERENCE_ROW!r} {theirs:,.0f} img/s: "
        f"{ratio:.2f}x (GPU target {target:g}x: {'met' if ratio >= target else 'not met'}; "
        f"{rows[project_row].get('settings', '')})"
    )


# --- energy_counter_vs_integral (printed) ----------------------------------------------------------


def energy_comparison(results: Path) -> tuple[str, Verdict | None]:
    """The INFO line of the strong 1-GPU point's counter against its power integral, and a failed
    verdict where the two differ absurdly (None otherwise, missing data included: said in the line)."""
    from scalestudy.analysis import energy  # pandas: only for this line

    name, folder = "energy_counter_vs_integral", results / STRONG_W1
    try:
        found = energy.counter_vs_integral(folder)
    except (OSError, ValueError, KeyError) as error:
        return f"INFO  {name}: {STRONG_W1}: not compared: {error}", None
    if found["reason"]:
        return f"INFO  {name}: {STRONG_W1}: not compared: {found['reason']}", None
    counter, integral = found["counter_j"], found["integral_j"]
    ratio = counter / integral if integral else float("inf")
    line = (
        f"INFO  {name}: {STRONG_W1} over {found['over']}: counter {counter:,.1f} J, "
        f"power integral {integral:,.1f} J, counter / integral {ratio:.4f}"
    )
    if 1 / ABSURD_ENERGY_RATIO <= ratio <= ABSURD_ENERGY_RATIO:
        return line, None
    return line, Verdict(
        name, False, f"counter / integral {ratio:.4f}: beyond a factor {ABSURD_ENERGY_RATIO:g}"
    )


# --- the command ----------------------------------------------------------------------------------


def verdicts(
    results: Path, benchmark_csv: Path, tolerance: float = 0.10, overlap_tolerance_s: float = 1.0
) -> list[Verdict]:
    return [
        check_overlap(results, overlap_tolerance_s),
        check_contention(results / "tables" / "runs.csv"),
        check_strong_point(results, benchmark_csv, tolerance),
        check_ncu(results / "profile" / "w1"),
        check_graphs(results),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m scalestudy.benchmark.studycheck", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="the verdicts on a study's results folder")
    check.add_argument("--results", type=Path, required=True, help="the study's results/ folder")
    check.add_argument("--benchmark", type=Path, required=True, help="the benchmark's CSV")
    check.add_argument("--tolerance", type=float, default=0.10, help="strong point vs benchmark")
    check.add_argument("--overlap-tolerance-s", type=float, default=1.0)
    args_of = sub.add_parser("bench-args", help="benchmark options at a run's settings, one a line")
    args_of.add_argument("--run-dir", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "bench-args":
        run = json.loads((args.run_dir / runfiles.SUMMARY).read_text())["run"]
        print("\n".join(benchmark_args(run)))
        return 0
    found = verdicts(args.results, args.benchmark, args.tolerance, args.overlap_tolerance_s)
    for verdict in found:
        print(verdict.line())
    print(project_vs_reference(args.results, args.benchmark))
    line, absurd = energy_comparison(args.results)
    print(line)
    if absurd:
        print(absurd.line())
        found.append(absurd)
    failed = [verdict.check for verdict in found if not verdict.passed]
    print(f"study check: {'FAILED: ' + ', '.join(failed) if failed else 'all passed'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
