"""Profiling parsers on hand-written fixtures (tests/fixtures/profiling/README.md: not measurements).

Every expected number below is worked out by hand from the fixture's designed timeline.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest

from scalestudy.profiling import ncu, parse_nsys, parse_torch, summarize
from scalestudy.profiling.breakdown import (
    Labels,
    RankTotals,
    breakdown_rows,
    intersection_length,
    merge_intervals,
    overlap_lower_bound,
    overlap_row,
)
from scalestudy.profiling.schema import (
    BREAKDOWN_COLUMNS,
    DATA_RANGE,
    NAMED_RANGES,
    NCU_COLUMNS,
    OVERLAP_COLUMNS,
    STEP_RANGE,
    TOP_KERNEL_COLUMNS,
)
from scalestudy.profiling.tables import TableError

FIXTURES = Path(__file__).parent / "fixtures" / "profiling"
NSYS = FIXTURES / "nsys_w2"
MS = 1e-3


def by_category(rows: list[dict], key: str = "time_s") -> dict[str, float]:
    return {row["category"]: row[key] for row in rows}


def nsys_rank(stats_dir: Path, rank: int) -> tuple[list[dict], dict, list[dict]]:
    totals, labels, top = parse_nsys.summarize(stats_dir, 2, 2, top=5)[rank]
    return breakdown_rows(totals, labels), overlap_row(totals, labels), top


# --- nsys ------------------------------------------------------------------------------------------


def test_nsys_rank0_breakdown_from_kernel_memcpy_and_nvtx_summaries():
    rows, _, _ = nsys_rank(NSYS, 0)
    times = by_category(rows)
    # window: NVTX step 2 x 10 ms; conv = fprop 2x3 + dgrad 2x2.5; norm = bn 2x1 + elementwise
    # 2x0.5 + multi_tensor_apply 2x0.5; memcpy 2x0.5; data 2x0.8; NCCL 2x3 of which [6, 8) ms of
    # each step overlaps dgrad: exposed 2 x 1 ms; idle/other = 20 - 19.6.
    expected = {
        "conv_gemm": 11.0,
        "norm_elementwise": 4.0,
        "communication": 2.0,
        "memory_copy": 1.0,
        "data_loading": 1.6,
        "idle_other": 0.4,
    }
    assert times == pytest.approx({k: v * MS for k, v in expected.items()})
    fractions = by_category(rows, "fraction")
    assert fractions == pytest.approx({k: v / 20.0 for k, v in expected.items()})
    assert by_category(rows, "time_per_step_s")["conv_gemm"] == pytest.approx(5.5 * MS)
    assert {row["tool"] for row in rows} == {"nsys"} and {row["method"] for row in rows} == {"nsys_trace"}
    assert {row["steps"] for row in rows} == {2}
    assert [row["window_s"] for row in rows] == pytest.approx([0.02] * 6)


def test_nsys_overlap_is_exact_from_the_gpu_trace():
    _, overlap0, _ = nsys_rank(NSYS, 0)
    _, overlap1, _ = nsys_rank(NSYS, 1)
    # rank 0: NCCL [6, 9) ms vs compute [1, 8) u [9, 9.7): 2 ms per step; rank 1: NCCL [6.5, 9): 1.5 ms.
    assert overlap0["communication_s"] == pytest.approx(6 * MS)
    assert overlap0["overlap_s"] == pytest.approx(4 * MS)
    assert overlap0["overlap_fraction"] == pytest.approx(2 / 3)
    assert overlap1["communication_s"] == pytest.approx(5 * MS)
    assert overlap1["overlap_s"] == pytest.approx(3 * MS)
    assert overlap0["compute_s"] == pytest.approx(15.4 * MS)  # conv 11 + norm 4 + unknown kernel 0.4


def test_nsys_rank1_domain_prefixed_ranges_and_a_full_window():
    rows, _, _ = nsys_rank(NSYS, 1)
    times = by_category(rows)
    # ':data' is found despite the domain prefix: 2 x 1 ms; 11 + 4 + 2 + 1 + 2 = 20 ms: no idle.
    assert times["data_loading"] == pytest.approx(2 * MS)
    assert times["communication"] == pytest.approx(2 * MS)
    assert times["idle_other"] == pytest.approx(0.0, abs=1e-12)
    assert sum(row["fraction"] for row in rows) == pytest.approx(1.0)


def test_nsys_without_trace_uses_the_overlap_lower_bound(tmp_path):
    stats = tmp_path / "stats"
    shutil.copytree(NSYS, stats)
    (stats / "r0_cuda_gpu_trace.csv").unlink()
    rows, overlap, _ = nsys_rank(stats, 0)
    # concurrent GPU work = conv 11 + norm 4 + unknown 0.4 + memcpy 1 = 16.4 ms (host data excluded);
    # lower bound = 6 + 16.4 - 20 = 2.4 ms; exposed comm 3.6; the categories add up to 21.2 ms > 20.
    assert overlap["overlap_s"] == pytest.approx(2.4 * MS)
    assert {row["method"] for row in rows} == {"nsys_summary"}
    times = by_category(rows)
    assert times["communication"] == pytest.approx(3.6 * MS)
    assert times["idle_other"] == 0.0
    assert by_category(rows, "fraction")["conv_gemm"] == pytest.approx(11 / 21.2)
    assert sum(row["fraction"] for row in rows) == pytest.approx(1.0)


def test_nsys_top_kernels_share_of_busy_time():
    _, _, top = nsys_rank(NSYS, 0)
    assert [row["category"] for row in top[:3]] == ["communication", "conv_gemm", "conv_gemm"]
    assert top[0]["name"].startswith("ncclDevKernel_AllReduce")  # ties (6 ms) are ordered by name
    assert top[0]["fraction_of_busy"] == pytest.approx(6 / 21.4)
    assert top[2]["avg_time_s"] == pytest.approx(2.5 * MS) and top[2]["instances"] == 2
    assert [row["position"] for row in top] == [1, 2, 3, 4, 5]


def test_nsys_missing_column_names_file_and_column(tmp_path):
    stats = tmp_path / "stats"
    shutil.copytree(NSYS, stats)
    path = stats / "r0_cuda_gpu_kern_sum.csv"
    path.write_text(path.read_text().replace("Instances", "Calls", 1))
    with pytest.raises(TableError) as error:
        parse_nsys.summarize(stats, 2, 2, top=5)
    assert "r0_cuda_gpu_kern_sum.csv" in str(error.value) and "Instances" in str(error.value)


def test_nsys_junk_number_names_the_column_and_row(tmp_path):
    stats = tmp_path / "stats"
    shutil.copytree(NSYS, stats)
    path = stats / "r1_nvtx_sum.csv"
    path.write_text(path.read_text().replace("20000000,2", "lots,2", 1))
    with pytest.raises(TableError, match=r"r1_nvtx_sum.csv: column 'Total Time \(ns\)' row 1"):
        parse_nsys.summarize(stats, 2, 2, top=5)


def test_nsys_stats_preamble_lines_are_skipped(tmp_path):
    path = tmp_path / "r0_cuda_gpu_mem_time_sum.csv"
    body = (NSYS / "r0_cuda_gpu_mem_time_sum.csv").read_text()
    path.write_text(
        "NOTICE: Existing SQLite export found: x.sqlite\n\nProcessing [x.sqlite] with [mem.py]...\n" + body
    )
    assert parse_nsys.memory_time(path) == pytest.approx(1 * MS)


def test_nsys_without_nvtx_falls_back_to_the_trace_span(tmp_path):
    stats = tmp_path / "stats"
    shutil.copytree(NSYS, stats)
    (stats / "r0_nvtx_sum.csv").unlink()
    totals, _, _ = parse_nsys.rank_summary(stats, 0, steps=2)
    # first activity at 1000.0 ms, last ends at 1019.7 ms; no data range.
    assert totals.window_s == pytest.approx(19.7 * MS) and totals.steps == 2 and totals.data_s == 0.0


# --- torch fallback --------------------------------------------------------------------------------


def test_torch_ops_table_breakdown_by_hand():
    ((totals, labels, top),) = parse_torch.summarize(FIXTURES / "torch_w2", 2, top=3)
    rows = breakdown_rows(totals, labels)
    # conv = 30 + 20 + 1 (addmm); norm = 6 + 4 + 3 + 2 = 15; memcpy 5; comm = the gloo:all_reduce
    # work's duration, 15 (its launching c10d::allreduce_, 0.4, is inside it); other =
    # aten::empty 0.5 + the SGD wrapper 1.0. Data range: 10 ms inclusive, 2 ms self: its 8 ms of
    # child ops are taken from memcpy (5) then norm (3): norm 12, memcpy 0. Overlap lower bound:
    # 15 + (51 + 12 + 1.5 + 0 + 10) - 80 = 9.5 ms, exposed 5.5; idle/other = 80 - 78.5.
    expected = {
        "conv_gemm": 51.0,
        "norm_elementwise": 12.0,
        "communication": 5.5,
        "memory_copy": 0.0,
        "data_loading": 10.0,
        "idle_other": 1.5,
    }
    assert by_category(rows) == pytest.approx({k: v * MS for k, v in expected.items()})
    assert by_category(rows, "fraction") == pytest.approx({k: v / 80.0 for k, v in expected.items()})
    assert {row["method"] for row in rows} == {"torch_cpu"} and {row["tool"] for row in rows} == {"torch"}
    assert overlap_row(totals, labels)["overlap_s"] == pytest.approx(9.5 * MS)
    assert [row["name"] for row in top] == [
        "aten::convolution_backward",
        "aten::mkldnn_convolution",
        "gloo:all_reduce",
    ]
    assert all(row["kind"] == "op" for row in top)


def test_torch_collective_launch_ops_count_when_no_work_rows(tmp_path):
    ops = (FIXTURES / "torch_w2/profile_ops.csv").read_text().splitlines()
    (tmp_path / "profile_ops.csv").write_text("\n".join(line for line in ops if "gloo:" not in line) + "\n")
    shutil.copy(FIXTURES / "torch_w2/profile_window.json", tmp_path / "profile_window.json")
    totals, _, _ = parse_torch.rank_summary(tmp_path / "profile_ops.csv", tmp_path / "profile_window.json")
    assert totals.busy["communication"] == pytest.approx(0.4 * MS)  # c10d::allreduce_ self time


def test_torch_window_record_must_have_wall_time(tmp_path):
    shutil.copy(FIXTURES / "torch_w2/profile_ops.csv", tmp_path / "profile_ops.csv")
    (tmp_path / "profile_window.json").write_text(json.dumps({"steps": 2}))
    with pytest.raises(TableError, match="profile_window.json: no 'wall_s'"):
        parse_torch.summarize(tmp_path, 1, top=3)


def test_torch_device_times_are_used_when_present(tmp_path):
    """As torch writes a CUDA run's table: the kernel's own row (no CPU time) and, again, its time as
    the self device time of the op that launched it; the kernel counts once."""
    ops = (
        "name,count,self_cpu_us,cpu_total_us,self_device_us,device_total_us\n"
        "aten::cudnn_convolution,4,50.0,300.0,4000.0,4000.0\n"
        "aten::convolution,4,20.0,340.0,0.0,4000.0\n"
        "sm80_xmma_fprop_implicit_gemm_kernel,4,0.0,0.0,4000.0,4000.0\n"
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL,1,0.0,0.0,1000.0,1000.0\n"
        "data,1,100.0,500.0,0.0,0.0\n"
    )
    (tmp_path / "profile_ops.csv").write_text(ops)
    (tmp_path / "profile_window.json").write_text(json.dumps({"wall_s": 0.01, "steps": 1}))
    totals, table, method = parse_torch.rank_summary(
        tmp_path / "profile_ops.csv", tmp_path / "profile_window.json"
    )
    assert method == "torch_device"
    assert set(table["name"]) == {
        "sm80_xmma_fprop_implicit_gemm_kernel",
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
    }
    assert totals.busy["conv_gemm"] == pytest.approx(4 * MS) and totals.busy[
        "communication"
    ] == pytest.approx(1 * MS)
    assert totals.data_s == pytest.approx(0.5 * MS) and not totals.data_is_concurrent


# --- ncu -------------------------------------------------------------------------------------------


def test_ncu_raw_page_to_percent_of_peak():
    rows = ncu.parse_raw((FIXTURES / "ncu_raw.csv").read_text(), "ncu_raw.csv")
    assert [row["id"] for row in rows] == [0, 1, 2, 3]  # the units row is not a kernel
    conv, bn, elementwise, custom = rows
    assert (conv["compute_pct_of_peak"], conv["memory_pct_of_peak"]) == (78.45, 41.20)
    assert conv["duration_s"] == pytest.approx(2_950_112e-9)  # "2,950,112" nsecond
    assert conv["category"] == "conv_gemm" and bn["category"] == "norm_elementwise"
    assert (bn["memory_pct_of_peak"], bn["dram_pct_of_peak"], bn["achieved_occupancy_pct"]) == (
        86.72,
        84.95,
        88.20,
    )
    assert elementwise["grid_size"] == 2048.0 and elementwise["registers_per_thread"] == 22.0
    assert math.isnan(custom["dram_pct_of_peak"]) and custom["category"] == "other"
    assert set(conv) == set(NCU_COLUMNS)


def test_ncu_scaled_units_and_progress_lines():
    text = (
        "==PROF== Connected to process 1 (/usr/bin/python3.11)\n"
        '"ID","Kernel Name","gpu__time_duration.sum","sm__throughput.avg.pct_of_peak_sustained_elapsed",'
        '"gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"\n'
        '"","","usecond","%","%"\n'
        '"0","k(float *)","12.50","10.0","20.0"\n'
    )
    (row,) = ncu.parse_raw(text)
    assert row["duration_s"] == pytest.approx(12.5e-6)
    assert math.isnan(row["achieved_occupancy_pct"])  # metric not collected


def test_ncu_missing_metric_and_bad_unit_are_named():
    header = (
        '"ID","Kernel Name","gpu__time_duration.sum","sm__throughput.avg.pct_of_peak_sustained_elapsed"\n'
    )
    with pytest.raises(ncu.NcuTableError, match="gpu__compute_memory_throughput"):
        ncu.parse_raw(header + '"0","k","1","2"\n', "x.csv")
    text = (
        '"ID","Kernel Name","gpu__time_duration.sum","sm__throughput.avg.pct_of_peak_sustained_elapsed",'
        '"gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"\n"","","cycle","%","%"\n"0","k","1","2","3"\n'
    )
    with pytest.raises(ncu.NcuTableError, match="x.csv: column 'gpu__time_duration.sum' has unit 'cycle'"):
        ncu.parse_raw(text, "x.csv")


def test_ncu_parse_cli_writes_the_kernels_table(tmp_path):
    out = tmp_path / "kernels.csv"
    assert ncu.main(["parse", "--raw", str(FIXTURES / "ncu_raw.csv"), "--kernels", str(out)]) == 0
    table = pd.read_csv(out)
    assert list(table.columns) == list(NCU_COLUMNS) and len(table) == 4 and set(table["tool"]) == {"ncu"}


# --- breakdown arithmetic --------------------------------------------------------------------------


def test_intervals_merge_and_intersect():
    assert merge_intervals([(3, 4), (0, 1), (0.5, 2), (5, 5)]) == [(0, 2), (3, 4)]
    assert intersection_length([(0, 2), (3, 4)], [(1, 3.5)]) == pytest.approx(1.5)
    assert intersection_length([(0, 1)], [(1, 2)]) == 0.0


def test_overlap_lower_bound_limits():
    assert overlap_lower_bound(comm_s=2, concurrent_s=5, window_s=10) == 0.0
    assert overlap_lower_bound(comm_s=2, concurrent_s=9, window_s=10) == 1.0
    assert overlap_lower_bound(comm_s=2, concurrent_s=20, window_s=10) == 2.0


def test_breakdown_rejects_an_empty_window():
    with pytest.raises(ValueError, match="window"):
        breakdown_rows(RankTotals(window_s=0.0, steps=2), Labels(1, 0, "torch", "torch_cpu"))


# --- summarize / combine CLIs ----------------------------------------------------------------------


def nsys_record(tmp_path: Path) -> Path:
    record = {"tool": "nsys", "world_size": 2, "steps": 2, "run_dir": str(tmp_path)}
    path = tmp_path / "profile_tool.json"
    path.write_text(json.dumps(record))
    return path


def test_summarize_world_and_combine_carry_the_tool(tmp_path):
    w2 = tmp_path / "profile" / "w2"
    assert (
        summarize.main(
            ["world", "--record", str(nsys_record(tmp_path)), "--nsys-stats", str(NSYS), "--out-dir", str(w2)]
        )
        == 0
    )
    torch_record = tmp_path / "torch.json"
    torch_record.write_text(
        json.dumps({"tool": "torch", "world_size": 1, "steps": 2, "run_dir": str(FIXTURES / "torch_w2")})
    )
    w1 = tmp_path / "profile" / "w1"
    assert (
        summarize.main(
            [
                "world",
                "--record",
                str(torch_record),
                "--nsys-stats",
                str(tmp_path / "none"),
                "--out-dir",
                str(w1),
            ]
        )
        == 0
    )
    out = tmp_path / "profile"
    assert summarize.main(["combine", "--out-dir", str(out), str(w1), str(w2)]) == 0
    breakdown = pd.read_csv(out / "breakdown.csv")
    assert list(breakdown.columns) == list(BREAKDOWN_COLUMNS)
    assert len(breakdown) == 6 * 3  # six categories for rank 0 of w1 and ranks 0, 1 of w2
    assert breakdown.groupby(["world_size", "rank"])["fraction"].sum().tolist() == pytest.approx(
        [1.0, 1.0, 1.0]
    )
    assert dict(breakdown.groupby("world_size")["tool"].unique().map(list)) == {1: ["torch"], 2: ["nsys"]}
    assert list(pd.read_csv(out / "top_kernels.csv").columns) == list(TOP_KERNEL_COLUMNS)
    assert list(pd.read_csv(out / "overlap.csv").columns) == list(OVERLAP_COLUMNS)


def test_summarize_refuses_a_run_that_used_no_profiler(tmp_path):
    record = tmp_path / "r.json"
    record.write_text(json.dumps({"tool": "none", "world_size": 1, "steps": 2, "run_dir": str(tmp_path)}))
    with pytest.raises(ValueError, match="tool 'none'"):
        summarize.world_tables(json.loads(record.read_text()), tmp_path, 5)


def test_the_trainers_named_ranges_are_the_ones_parsed():
    """The parsers look for the trainer's `step` and `data` ranges and skip every named range."""
    source = Path(__file__).resolve().parent.parent / "scalestudy" / "train" / "trainer.py"
    if not source.is_file():
        pytest.skip("scalestudy/train/trainer.py not there")
    used = set(re.findall(r'named_range\("(\w+)"\)', source.read_text()))
    assert {STEP_RANGE, DATA_RANGE} <= used
    assert used <= set(NAMED_RANGES), used - set(NAMED_RANGES)


def test_nsys_window_covers_the_gpu_running_past_the_cpu_step_ranges(tmp_path):
    """The trainer queues ahead of the GPU: its CPU-side step ranges (2 x 6 ms, start/end style) end
    well before the GPU drains (trace 1000.0 -> 1019.7 ms). The window is the trace's span, so
    the busy time (19.6 ms) fits in it and idle is what is left, not clipped to 0."""
    stats = tmp_path / "stats"
    shutil.copytree(NSYS, stats)
    nvtx = stats / "r0_nvtx_sum.csv"
    lines = nvtx.read_text().splitlines()
    lines[1] = "50.0,12000000,2,6000000.0,6000000.0,6000000,6000000,0.0,StartEnd,step"
    nvtx.write_text("\n".join(lines) + "\n")
    totals, _, _ = parse_nsys.rank_summary(stats, 0, steps=99)
    assert totals.window_s == pytest.approx(19.7 * MS) and totals.steps == 2  # steps: the ranges' count
    times = by_category(breakdown_rows(totals, Labels(2, 0, "nsys", "nsys_trace")))
    assert times["idle_other"] == pytest.approx(0.1 * MS)
    assert sum(times.values()) == pytest.approx(19.7 * MS)
