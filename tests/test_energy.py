"""Energy per run (scalestudy.analysis.energy) from GPU monitor files whose energy counter and power
samples are known: a stand-in NVML (tests/monitor_helpers.py's FakeNvml) drives the real monitor, whose
files the analysis reads as it reads a run folder."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from scalestudy import atomic
from scalestudy.analysis import energy
from scalestudy.plan import runfiles
from scalestudy.plan.runfiles import MONITOR_COLUMNS as COLUMNS
from scalestudy.train import gpu_monitor as monitor
from scalestudy.train import gpu_monitor_files
from scalestudy.train.gpu_monitor import GpuMonitor
from tests.monitor_helpers import UUIDS, FakeNvml

TIMES = [round(0.1 * k, 1) for k in range(101)]  # 0 .. 10 s at the monitor's 0.1 s
COUNTER_W = (412.0, 380.0)  # what the counters say each GPU draws (the power readings say 350.5, 351.5)
SEGMENTS = [[2.03, 5.51], [5.77, 8.94]]  # the window's unpaused stretches, between samples
RATE = 1234.5  # images/s in the window (both GPUs)


def counter_readings(power_w: float, start_mj: int = 5_000_000_000) -> list[int]:
    """The counter at open (the monitor's check), then at every sample: power_w x t."""
    return [start_mj] + [start_mj + round(power_w * 1000 * t) for t in TIMES]


def results(**overrides) -> dict:
    base = {
        "world_size": 2,
        "device": "cuda",
        "images_per_s": RATE,
        "window_filled": True,
        "measure_start_s": SEGMENTS[0][0],
        "measure_end_s": SEGMENTS[-1][1],
        "measure_segments_s": SEGMENTS,
        "whole_run_images_per_s": 1100.0,
        "whole_run_step_time_s": 0.1,
        "steps": 90,
        "time_to_target_s": 7.5,
        "total_time_s": 10.5,
        "resumed_from_step": None,
    }
    return {**base, **overrides}


def run_folder(tmp_path, nvml: FakeNvml, ranks=(0, 1)):
    """Each rank's monitor on its own GPU of `nvml`, sampled at TIMES, merged as rank 0 writes them."""
    reports = []
    for rank in ranks:
        node = GpuMonitor(interval_s=0.1, t0=0.0, host="gpu01", rank=rank, gpu_uuids=[UUIDS[rank]], nvml=nvml)
        assert node.open()
        for now in TIMES:
            node.sample(now)
        reports.append(node.stop())
    gpu_monitor_files.write_outputs(tmp_path, reports, interval_s=0.1)
    return tmp_path


def test_joules_per_image_from_the_counter_within_one_percent(tmp_path):
    nvml = FakeNvml(energy={0: counter_readings(COUNTER_W[0]), 1: counter_readings(COUNTER_W[1])})
    keys = energy.of_folder(run_folder(tmp_path, nvml), results())
    power = sum(COUNTER_W)  # both GPUs, W
    seconds = sum(end - start for start, end in SEGMENTS)
    assert keys["energy_source"] == "counter" and keys["energy_gpus"] == 2
    assert keys["joules_per_sample"] == pytest.approx(power / RATE, rel=0.01)
    assert keys["energy_window_j"] == pytest.approx(power * seconds, rel=1e-6)
    assert keys["mean_power_w"] == pytest.approx(power, rel=1e-6)
    # the whole run: the first sample (0 s) to the last (10 s), over the samples trained
    assert keys["energy_j"] == pytest.approx(power * 10.0, rel=1e-6)
    assert keys["joules_per_sample_run"] == pytest.approx(power * 10.0 / (1100.0 * 0.1 * 90), rel=1e-6)
    assert keys["energy_to_target_j"] == pytest.approx(power * 7.5, rel=1e-6)
    assert keys["gpu_hours"] == pytest.approx(2 * 10.5 / 3600)
    assert keys["gpu_hours_to_target"] == pytest.approx(2 * 7.5 / 3600)
    assert keys["energy_note"] == ""


def test_a_gpu_without_the_counter_falls_back_to_its_power_integral_and_says_so(tmp_path):
    nvml = FakeNvml(no_energy=(0, 1))
    keys = energy.of_folder(run_folder(tmp_path, nvml), results())
    assert keys["energy_source"].startswith("power integral: 2 of 2 GPU(s) without the energy counter")
    assert "Not Supported" in keys["energy_source"]
    assert keys["joules_per_sample"] == pytest.approx((350.5 + 351.5) / RATE, rel=0.01)


def test_one_gpu_without_the_counter_makes_the_run_a_power_integral(tmp_path):
    nvml = FakeNvml(energy={0: counter_readings(COUNTER_W[0])}, no_energy=(1,))
    keys = energy.of_folder(run_folder(tmp_path, nvml), results())
    assert keys["energy_source"].startswith("power integral: 1 of 2 GPU(s)")
    assert UUIDS[1] not in keys["energy_source"] or "Not Supported" in keys["energy_source"]
    assert keys["mean_power_w"] == pytest.approx(COUNTER_W[0] + 351.5, rel=1e-6)


def test_a_counter_reset_is_counted_and_named(tmp_path):
    """The counter of GPU 0 restarts near zero at 6.0 s: that 0.1 s counts the power readings."""
    readings = counter_readings(COUNTER_W[0])
    reset = 1 + TIMES.index(6.0)
    readings[reset:] = [7 + round(COUNTER_W[0] * 1000 * (t - 6.0)) for t in TIMES[reset - 1 :]]
    nvml = FakeNvml(energy={0: readings, 1: counter_readings(COUNTER_W[1])})
    keys = energy.of_folder(run_folder(tmp_path, nvml), results())
    bridged = 0.1 * (350.5 - COUNTER_W[0])  # 5.9 .. 6.0 s at the power readings' 350.5 W
    assert keys["energy_j"] == pytest.approx(sum(COUNTER_W) * 10.0 + bridged, rel=1e-6)
    assert f"{UUIDS[0]}: counter reset at 6.0 s, bridged by power samples" in keys["energy_note"]
    assert keys["energy_source"] == "counter"


def test_the_power_integral_interpolates_at_the_window_bounds():
    """A linear power ramp, sampled once a second: the trapezoid with the bounds interpolated is exact."""
    times = np.arange(0.0, 11.0)
    rows = pd.DataFrame(
        {"time_s": times, "host": "gpu01", "gpu_uuid": UUIDS[0], "power_w": 100.0 + 10.0 * times}
    )
    (gpu,) = energy.series(rows)
    assert gpu.source == energy.INTEGRAL
    start, end = 2.25, 7.6  # the integral of 100 + 10 t
    assert gpu.joules(start, end) == pytest.approx(100 * (end - start) + 5 * (end**2 - start**2))
    assert gpu.joules(-0.5, 3.0) is None and gpu.joules(3.0, 10.5) is None  # outside the samples


def test_a_cpu_run_is_not_measured_with_the_reason_never_zero(tmp_path):
    node = monitor.for_device("cpu", 0.1).start()
    gpu_monitor_files.write_outputs(tmp_path, [node.stop()], interval_s=0.1)
    keys = energy.of_folder(tmp_path, results(device="cpu"))
    assert keys["energy_source"].startswith("not measured: no NVIDIA GPU (device cpu)")
    assert "RAPL" in keys["energy_source"] and keys["energy_gpus"] == 0
    numbers = (
        "energy_j",
        "energy_window_j",
        "joules_per_sample",
        "joules_per_sample_run",
        "energy_to_target_j",
    )
    assert all(keys[key] is None for key in numbers)
    assert keys["gpu_hours"] == pytest.approx(2 * 10.5 / 3600)  # rank-hours are still hours


def test_a_run_folder_without_monitor_files_says_so(tmp_path):
    keys = energy.of_folder(tmp_path, results())
    assert keys["energy_source"] == f"not measured: no {runfiles.GPU_MONITOR} in {tmp_path}"


def test_a_rank_without_its_gpu_leaves_the_run_not_measured(tmp_path):
    """Rank 1 found no GPU: rank 0's GPU alone would understate the run's energy."""
    node = GpuMonitor(interval_s=0.1, t0=0.0, host="gpu01", gpu_uuids=[UUIDS[0]], nvml=FakeNvml())
    assert node.open()
    for now in TIMES:
        node.sample(now)
    lost = GpuMonitor(host="gpu02", rank=1, no_gpu_reason="no NVML GPU on gpu02 has UUID GPU-x").start()
    gpu_monitor_files.write_outputs(tmp_path, [node.stop(), lost.stop()], interval_s=0.1)
    keys = energy.of_folder(tmp_path, results())
    assert keys["energy_source"].startswith("not measured: not every rank sampled its GPU")
    assert "gpu02" in keys["energy_source"] and keys["energy_j"] is None and keys["energy_gpus"] == 0


def test_a_window_the_samples_do_not_cover_leaves_the_window_empty_and_says_why(tmp_path):
    nvml = FakeNvml(energy={0: counter_readings(COUNTER_W[0]), 1: counter_readings(COUNTER_W[1])})
    keys = energy.of_folder(run_folder(tmp_path, nvml), results(measure_segments_s=[[8.0, 10.5]]))
    assert keys["energy_window_j"] is None and keys["joules_per_sample"] is None
    assert "do not cover the window" in keys["energy_note"]
    assert keys["energy_j"] == pytest.approx(sum(COUNTER_W) * 10.0)  # the whole run still is


def test_a_resumed_run_has_no_whole_run_energy_and_its_own_window_still_counts(tmp_path):
    nvml = FakeNvml(energy={0: counter_readings(COUNTER_W[0]), 1: counter_readings(COUNTER_W[1])})
    keys = energy.of_folder(run_folder(tmp_path, nvml), results(resumed_from_step=40))
    assert keys["energy_j"] is None and keys["energy_to_target_j"] is None
    assert "resumed at step 40" in keys["energy_note"]
    assert keys["joules_per_sample"] == pytest.approx(sum(COUNTER_W) / RATE, rel=0.01)


@pytest.mark.parametrize(
    ("window", "note"),
    [
        ({"window_filled": False}, "no filled measurement window"),
        ({"measure_segments_s": None, "measure_start_s": None, "measure_end_s": None}, "earlier attempt"),
    ],
)
def test_without_this_attempts_window_only_the_whole_run_is_measured(tmp_path, window, note):
    nvml = FakeNvml(energy={0: counter_readings(COUNTER_W[0]), 1: counter_readings(COUNTER_W[1])})
    keys = energy.of_folder(run_folder(tmp_path, nvml), results(**window))
    assert keys["energy_window_j"] is None and note in keys["energy_note"]
    assert keys["energy_j"] == pytest.approx(sum(COUNTER_W) * 10.0)


def test_the_counter_against_the_power_integral_over_the_window(tmp_path):
    nvml = FakeNvml(energy={0: counter_readings(COUNTER_W[0]), 1: counter_readings(COUNTER_W[1])})
    folder = run_folder(tmp_path, nvml)
    atomic.write_json(folder / runfiles.SUMMARY, {"results": results()})
    seconds = sum(end - start for start, end in SEGMENTS)
    found = energy.counter_vs_integral(folder)
    assert found["over"] == "the measurement window" and found["reason"] is None
    assert found["counter_j"] == pytest.approx(sum(COUNTER_W) * seconds)
    assert found["integral_j"] == pytest.approx((350.5 + 351.5) * seconds)


def test_the_counter_against_the_integral_without_a_counter_says_why(tmp_path):
    folder = run_folder(tmp_path, FakeNvml(no_energy=(0, 1)))
    atomic.write_json(folder / runfiles.SUMMARY, {"results": results()})
    found = energy.counter_vs_integral(folder)
    assert found["counter_j"] is None and found["reason"] == "no energy counter samples"


def test_the_scaling_columns_summarise_repeats_and_name_the_sources():
    group = pd.DataFrame(
        {
            "joules_per_sample": [0.5, 0.7],
            "energy_to_target_j": [1000.0, math.nan],
            "energy_source": ["counter", "counter"],
        }
    )
    row = energy.scaling_columns(group, 0.95)
    assert row["joules_per_sample_mean"] == pytest.approx(0.6) and row["joules_per_sample_ci_low"] < 0.6
    assert row["energy_to_target_j_mean"] == 1000.0 and math.isnan(row["energy_to_target_j_std"])
    assert math.isnan(row["mean_power_w_mean"])  # a column the catalog lacks: NaN, never zero
    assert row["energy_source"] == "counter"
    old = energy.scaling_columns(group.drop(columns="energy_source"), 0.95)
    assert old["energy_source"].startswith("not measured: runs.csv has no energy_source column")


def test_the_monitor_columns_hold_energy_last():
    assert COLUMNS[-1] == "energy_j"


@pytest.mark.parametrize(
    ("joules", "unit"),
    [(2.5e6, (1e6, "MJ")), (812.0, (1.0, "J")), (3.2e-4, (1e-6, "µJ")), (0.0, (1e-6, "µJ"))],
)
def test_energy_reads_in_its_own_unit(joules, unit):
    assert energy.energy_unit(joules) == unit


def test_a_gpu_two_ranks_share_counts_once(tmp_path):
    """Two ranks on one GPU each sample it (their own monitors): its energy is counted once."""
    nvml = FakeNvml(energy={0: counter_readings(COUNTER_W[0]) * 2})  # both monitors read the same counter
    reports = []
    for rank in (0, 1):
        nvml.energy_calls[0] = 0
        node = GpuMonitor(interval_s=0.1, t0=0.0, host="gpu01", rank=rank, gpu_uuids=[UUIDS[0]], nvml=nvml)
        assert node.open()
        for now in TIMES:
            node.sample(now)
        reports.append(node.stop())
    gpu_monitor_files.write_outputs(tmp_path, reports, interval_s=0.1)
    keys = energy.of_folder(tmp_path, results())
    assert keys["energy_gpus"] == 1 and keys["energy_j"] == pytest.approx(COUNTER_W[0] * 10.0)
