"""Issue 51's GPU numbers from one device call's folder (scalestudy.benchmark.targets): each target
met, not met or not measured, and what the step variants decide; the 2026-11-28 H200 folder read
back gives that session's numbers (docs/measurements/h200-2026-11-28)."""

from __future__ import annotations

import csv
from pathlib import Path

from scalestudy.benchmark import targets
from tests.conftest import REPO


def write(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=sorted({k for row in rows for k in row}))
        writer.writeheader()
        writer.writerows(rows)


def run(point: str, rate: float, startup: float, stage: str = "sensitivity", **extra) -> dict:
    return {"stage": stage, "point": point, "images_per_s": rate, "startup_s": startup, **extra}


def device_call(folder: Path, *, bf16_512=79_000.0, warm=(1.2, 0.4), capture_ratio=1.02) -> Path:
    """A folder as gpu_check.sh leaves it, every target met unless told."""
    loaded = {
        "compile.artifacts.loaded": True,
        "compile.seconds": warm[0],
        "compile.artifacts.load_s": warm[1],
    }
    graphs = {"cuda_graphs.expected": True, "cuda_graphs.skipped": False}
    write(
        folder / "runs.csv",
        [
            run("default", 7_600.0, 5.0, stage="baseline"),
            run("strong/w1_r0", 60_000.0, 6.0, stage="scaling", **loaded, **graphs),
            run("bf16/bs256", 61_000.0, 6.5, **loaded, **graphs),
            run("bf16/bs512", bf16_512, 24.0, **graphs),
            run("tf32/bs256", 33_000.0, 26.0, **graphs),
        ],
    )
    (folder / "study-check.txt").write_text(
        "PASS  no_overlap: ...\nPASS  cuda_graphs: ...\nstudy check: all passed\nstudy wall 287 s\n"
    )
    write(
        folder / "study" / "benchmark.csv",
        [{"name": "reference trainer", "median": 19_000}, {"name": "project trainer bf16", "median": 61_000}],
    )
    write(
        folder / "lm.csv",
        [{"name": "ddp", "mfu_pct": 44.0, "repeats": 3}, {"name": "fsdp", "ratio": 0.97, "repeats": 3}],
    )
    write(
        folder / "variants.csv",
        [
            {"kind": "cell", "variant": "eager", "repeats": 2, "mean": 45_000},
            {"kind": "cell", "variant": "compiled-cudagraphs", "repeats": 2, "mean": 78_000, "noise": 0.05},
            {
                "kind": "cell",
                "variant": "captured",
                "repeats": 2,
                "mean": 78_000 * capture_ratio,
                "noise": 0.06,
            },
        ],
    )
    return folder


def test_a_call_that_meets_every_target_says_so_line_by_line(tmp_path):
    lines = targets.report(device_call(tmp_path))
    assert [line.split()[0] for line in lines[:-1]] == ["met"] * 10, lines
    assert (
        "warm compile, the slowest job that loaded artifacts: 1.6 s (target <= 3 s); 2 jobs: 1.6, 1.6"
        in lines[2]
    )
    assert lines[3].startswith("met          median fixed cost") and ": 6.5 s" in lines[3]  # of 5 runs
    assert "3.21 x" in lines[7] and "61,000 vs 19,000 img/s" in lines[7]
    assert lines[-1].endswith("keep Inductor's CUDA graphs (compile_mode auto) as the study's step")


def test_what_misses_is_not_met_and_what_is_missing_is_not_measured(tmp_path):
    folder = device_call(tmp_path, bf16_512=70_000.0, warm=(5.0, 0.5), capture_ratio=1.3)
    (folder / "lm.csv").unlink()
    lines = targets.report(folder)
    assert lines[0].startswith("NOT MET      ResNet bf16/512 (sensitivity): 70,000 img/s")
    assert lines[2].startswith("NOT MET      warm compile")
    assert [line for line in lines if line.startswith("not measured")] == [
        "not measured GPT-2 small MFU (DDP, one rank): - % (target >= 42 %)",
        "not measured FSDP2 / DDP at one rank: - x (target >= 0.95 x); no fsdp row in lm.csv",
    ]
    assert "captured / compiled-cudagraphs 1.300 (noise 0.060): the whole-step capture is faster" in lines[-1]


def test_the_2026_11_28_h200_session_reads_back_as_the_issue_states_it(tmp_path):
    folder = REPO / "docs" / "measurements" / "h200-2026-11-28"
    lines = targets.report(folder)
    assert (
        "ResNet bf16/512 (sensitivity): 52,141 img/s" in lines[0]
        and "bf16/256 (sensitivity): 27,040" in lines[1]
    )
    assert (
        "project trainer vs reference trainer: 1.45 x" in lines[7]
        and "MFU (DDP, one rank): 29.8 %" in lines[8]
    )
    assert "FSDP2 / DDP at one rank: 0.674 x" in lines[9] and "1 repeats (the target asks for 3)" in lines[9]
