"""python -m scalestudy.benchmark.targets --folder docs/measurements/<device>-<date> [--runs RUNS.csv]

Issue 51's GPU numbers, read from what one call of scripts/gpu_check.sh wrote (its folder:
study-check.txt, runs.csv, study/benchmark.csv, lm.csv, variants.csv; a file missing leaves its
numbers "not measured"): one line per target with the value, the target and met / NOT MET, and
what the step variants decide (CUDA graphs by Inductor against the eager step captured whole).
Written to targets.txt in the folder too (gpu_check.sh's last part).

- ResNet bf16/512 >= 75,000 img/s, bf16/256 >= 55,000: runs.csv, sensitivity bf16/bs512, bf16/bs256;
- a warm compile <= 3 s a job: runs.csv, compile.seconds + compile.artifacts.load_s of the runs that
  loaded artifacts; median fixed cost <= 7 s: startup_s over the study's training runs; no CUDA
  graph skipped: cuda_graphs.skipped;
- every verdict PASS, study wall <= 300 s: study-check.txt;
- project vs reference >= 3x: study/benchmark.csv, the project trainer's row at the strong point's
  precision over the reference's;
- GPT-2 >= 42 % MFU, FSDP2 / DDP >= 0.95 over 3 repeats: lm.csv, the ddp row's mfu_pct, the fsdp
  row's ratio and repeats.
"""

from __future__ import annotations

import argparse
import csv
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from scalestudy import atomic
from scalestudy.benchmark.lm import PARALLELISMS
from scalestudy.plan.runfiles import NOT_MEASURED


@dataclass(frozen=True)
class Target:
    name: str
    value: float | None  # None: not measured (why in `note`)
    minimum: float | None = None
    maximum: float | None = None
    note: str = ""
    unit: str = ""

    def verdict(self) -> str:
        if self.value is None:
            return NOT_MEASURED
        low = self.minimum is None or self.value >= self.minimum
        high = self.maximum is None or self.value <= self.maximum
        return "met" if low and high else "NOT MET"

    def line(self) -> str:
        bound = f">= {self.minimum:,g}" if self.minimum is not None else f"<= {self.maximum:,g}"
        value = (
            "-"
            if self.value is None
            else f"{self.value:,.0f}"
            if abs(self.value) >= 100
            else f"{self.value:.3g}"
        )
        text = f"{self.verdict():<12} {self.name}: {value} {self.unit} (target {bound} {self.unit})".rstrip()
        return f"{text}; {self.note}" if self.note else text


def rows(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def number(text) -> float | None:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if value == value else None  # NaN: none


def point_rate(runs: list[dict], stage: str, point: str) -> float | None:
    return next(
        (number(r.get("images_per_s")) for r in runs if (r["stage"], r["point"]) == (stage, point)), None
    )


def study_targets(runs: list[dict]) -> list[Target]:
    """The ResNet study's throughput, warm compile, fixed cost and CUDA graphs, from its runs.csv."""
    missing = "no runs.csv" if not runs else ""
    loaded = [r for r in runs if str(r.get("compile.artifacts.loaded")).lower() == "true"]
    warm = [
        (number(r.get("compile.seconds")) or 0.0) + (number(r.get("compile.artifacts.load_s")) or 0.0)
        for r in loaded
    ]
    startups = [value for value in (number(r.get("startup_s")) for r in runs) if value is not None]
    skipped = [
        f"{r['stage']}/{r['point']}" for r in runs if str(r.get("cuda_graphs.skipped")).lower() == "true"
    ]
    expected = [r for r in runs if str(r.get("cuda_graphs.expected")).lower() == "true"]
    return [
        Target(
            "ResNet bf16/512 (sensitivity)",
            point_rate(runs, "sensitivity", "bf16/bs512"),
            75_000,
            unit="img/s",
            note=missing,
        ),
        Target(
            "ResNet bf16/256 (sensitivity)",
            point_rate(runs, "sensitivity", "bf16/bs256"),
            55_000,
            unit="img/s",
            note=missing,
        ),
        Target(
            "warm compile, the slowest job that loaded artifacts",
            max(warm) if warm else None,
            maximum=3,
            unit="s",
            note=f"{len(warm)} jobs: " + ", ".join(f"{w:.1f}" for w in warm)
            if warm
            else "no run loaded artifacts",
        ),
        Target(
            "median fixed cost (launch -> first step's end)",
            statistics.median(startups) if startups else None,
            maximum=7,
            unit="s",
            note=f"{len(startups)} runs" if startups else "no startup_s",
        ),
        Target(
            "runs whose CUDA graphs were skipped",
            float(len(skipped)) if expected else None,
            maximum=0,
            note=", ".join(skipped)
            or (f"{len(expected)} expected graphs" if expected else "no run expected graphs"),
        ),
    ]


def check_targets(check: Path) -> list[Target]:
    """Every verdict PASS and the study's wall time, from study-check.txt."""
    if not check.is_file():
        return [
            Target("verdicts failed", None, maximum=0, note=f"no {check.name}"),
            Target("study wall", None, maximum=300, unit="s"),
        ]
    lines = check.read_text().splitlines()
    failed = [line.split(":")[0].removeprefix("FAIL").strip() for line in lines if line.startswith("FAIL")]
    wall = next((float(m[1]) for m in map(re.compile(r"study wall (\d+) s").fullmatch, lines) if m), None)
    return [
        Target("verdicts failed", float(len(failed)), maximum=0, note=", ".join(failed)),
        Target("study wall, ncu included", wall, maximum=300, unit="s"),
    ]


def benchmark_target(benchmark: Path, runs: list[dict]) -> Target:
    """The benchmark's project trainer row at the strong 1-GPU point's precision over the reference's."""
    strong = [r for r in runs if (r["stage"], r["point"]) == ("scaling", "strong/w1_r0")]
    precision = (strong[0].get("config.precision") if strong else None) or "bf16"
    found = {r["name"]: number(r.get("median")) for r in rows(benchmark)}
    ours, theirs = found.get(f"project trainer {precision}"), found.get("reference trainer")
    value = ours / theirs if ours and theirs else None
    note = (
        f"{ours:,.0f} vs {theirs:,.0f} img/s"
        if value
        else f"no project and reference rows in {benchmark.name}"
    )
    return Target("project trainer vs reference trainer", value, 3, unit="x", note=note)


def lm_targets(lm: Path) -> list[Target]:
    found = {r["name"]: r for r in rows(lm)}
    ddp, fsdp = (found.get(name, {}) for name in PARALLELISMS)
    repeats = number(fsdp.get("repeats"))
    note = f"{repeats:g} repeats" if repeats else f"no fsdp row in {lm.name}"
    if repeats is not None and repeats < 3:
        note += " (the target asks for 3)"
    return [
        Target(
            "GPT-2 small MFU (DDP, one rank)",
            number(ddp.get("mfu_pct")),
            42,
            unit="%",
            note=ddp.get("settings", ""),
        ),
        Target("FSDP2 / DDP at one rank", number(fsdp.get("ratio")), 0.95, unit="x", note=note),
    ]


def graphs_decision(variants: Path) -> str:
    """What the step variants decide: Inductor's CUDA graphs against the eager step captured whole."""
    cells = {
        r["variant"]: r
        for r in rows(variants)
        if r.get("kind") == "cell" and r.get("repeats") not in ("", "0")
    }
    graphs, whole = cells.get("compiled-cudagraphs"), cells.get("captured")
    if not graphs or not whole:
        return f"decision: {NOT_MEASURED} (variants.csv needs compiled-cudagraphs and captured cells)"
    a, b = number(graphs["mean"]), number(whole["mean"])
    noise = max(number(graphs.get("noise")) or 0.0, number(whole.get("noise")) or 0.0)
    ratio = b / a
    if ratio > 1 + noise:
        verdict = "the whole-step capture is faster beyond the noise: move it into the trainer (a follow-up)"
    else:
        verdict = "keep Inductor's CUDA graphs (compile_mode auto) as the study's step"
    return f"decision: captured / compiled-cudagraphs {ratio:.3f} (noise {noise:.3f}): {verdict}"


def report(folder: Path, runs_csv: Path | None = None) -> list[str]:
    runs = rows(runs_csv or folder / "runs.csv")
    found = [
        *study_targets(runs),
        *check_targets(folder / "study-check.txt"),
        benchmark_target(folder / "study" / "benchmark.csv", runs),
        *lm_targets(folder / "lm.csv"),
    ]
    return [target.line() for target in found] + [graphs_decision(folder / "variants.csv")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m scalestudy.benchmark.targets", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--folder", type=Path, required=True, help="gpu_check.sh's measurement folder")
    parser.add_argument("--runs", type=Path, help="the study's runs.csv (default: FOLDER/runs.csv)")
    args = parser.parse_args(argv)
    lines = report(args.folder, args.runs)
    print("\n".join(lines))
    atomic.write_text(args.folder / "targets.txt", "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
