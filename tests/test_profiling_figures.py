"""Profiling figures from the parsed fixture tables (PNG + PDF), and the ncu 'not run' note."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scalestudy.profiling import figures, summarize
from scalestudy.profiling.tables import read_table

FIXTURES = Path(__file__).parent / "fixtures" / "profiling"


@pytest.fixture(scope="module")
def tables(tmp_path_factory) -> Path:
    """results/profile/ of a w1 torch run and a w2 nsys run, parsed from the fixtures."""
    root = tmp_path_factory.mktemp("profile")
    records = {
        "w1": {"tool": "torch", "world_size": 1, "steps": 2, "run_dir": str(FIXTURES / "torch_w2")},
        "w2": {"tool": "nsys", "world_size": 2, "steps": 2, "run_dir": str(root)},
    }
    for name, record in records.items():
        path = root / f"{name}.json"
        path.write_text(json.dumps(record))
        summarize.write_world(path, FIXTURES / "nsys_w2", root / name, top=15)
    summarize.combine([root / "w1", root / "w2"], root)
    return root


def assert_figure(png: Path, pdf: Path) -> None:
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert pdf.read_bytes()[:5] == b"%PDF-"


def test_breakdown_bars_stack_to_the_step_time(tables, tmp_path):
    frame = read_table(tables / "breakdown.csv", ["world_size"], "breakdown")
    per_step = figures.step_time_by_category(frame, tables / "breakdown.csv")
    # w2 (nsys): mean over ranks of (window 20 ms / 2 steps) = 10 ms; w1 (torch): 80 ms / 2 = 40 ms
    assert per_step.sum(axis=1).tolist() == pytest.approx([0.040, 0.010])
    assert list(per_step.index) == [(1, "torch"), (2, "nsys")]
    # rank 0 exposes 1 ms of NCCL per step, rank 1 too: mean 1 ms
    assert per_step.loc[(2, "nsys"), "communication"] == pytest.approx(0.001)
    png, pdf = tmp_path / "b.png", tmp_path / "b.pdf"
    figures.main(
        ["breakdown", "--breakdown", str(tables / "breakdown.csv"), "--png", str(png), "--pdf", str(pdf)]
    )
    assert_figure(png, pdf)


def test_top_kernels_table(tables, tmp_path):
    frame = read_table(tables / "top_kernels.csv", ["name"], "top")
    cells = figures.top_kernel_cells(frame, tables / "top_kernels.csv", per_world=3)
    assert [row[:2] for row in cells] == [
        ["1 (torch)", "1"],
        ["1 (torch)", "2"],
        ["1 (torch)", "3"],
        ["2 (nsys)", "1"],
        ["2 (nsys)", "2"],
        ["2 (nsys)", "3"],
    ]
    assert cells[3][2].startswith("ncclDevKernel") and cells[3][4] == "28.0"  # 6 / 21.4 ms of rank 0
    png, pdf = tmp_path / "t.png", tmp_path / "t.pdf"
    figures.main(
        [
            "top-kernels",
            "--top-kernels",
            str(tables / "top_kernels.csv"),
            "--png",
            str(png),
            "--pdf",
            str(pdf),
        ]
    )
    assert_figure(png, pdf)


def test_ncu_scatter_and_its_not_run_note(tmp_path):
    kernels = tmp_path / "ncu_kernels.csv"
    from scalestudy.profiling import ncu

    ncu.main(["parse", "--raw", str(FIXTURES / "ncu_raw.csv"), "--kernels", str(kernels)])
    status = tmp_path / "status.json"
    status.write_text(json.dumps({"ran": True, "kernels": 4}))
    png, pdf = tmp_path / "n.png", tmp_path / "n.pdf"
    figures.main(
        [
            "ncu-throughput",
            "--status",
            str(status),
            "--kernels",
            str(kernels),
            "--png",
            str(png),
            "--pdf",
            str(pdf),
        ]
    )
    assert_figure(png, pdf)
    assert figures.ncu_note({"ran": False, "reason": "no CUDA GPU"}) == "ncu not run: no CUDA GPU"
    assert figures.ncu_note({"ran": True, "kernels": 0}) == "ncu ran but profiled no kernels"
    assert figures.ncu_note({"ran": True, "kernels": 4}) is None
    figures.main(
        ["ncu-throughput", "--not-run", "disabled in the config", "--png", str(png), "--pdf", str(pdf)]
    )
    assert_figure(png, pdf)
