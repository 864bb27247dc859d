"""The analysis of the GPU monitor's samples (scalestudy.analysis.monitor_window and acceptance) on
constructed run folders: only the samples in the measurement window count, pauses inside it are left
out, and the acceptance rows pass, fail or say why the GPUs were not measured."""

import json

import pandas as pd
import pytest

from scalestudy import atomic
from scalestudy.analysis import acceptance, monitor_window, settings
from scalestudy.plan.runfiles import MONITOR_COLUMNS as COLUMNS
from tests.monitor_helpers import UUIDS


def _run_folder(root, name, frame, window=None):
    folder = root / "results" / "runs" / "scaling" / name
    atomic.write_csv(folder / "gpu_monitor.csv", frame)
    results = {"measure_start_s": window[0], "measure_end_s": window[1]} if window else {}
    atomic.write_json(folder / "summary.json", {"results": results})
    return folder / "gpu_monitor.csv"


def _frame(sm_inside=85.0, gpm=True, power=400.0):
    """Ten samples 1 s apart of one GPU: busy in 3 s..6 s, idle (start-up, evaluation) otherwise."""
    times = [float(t) for t in range(10)]
    busy = [3 <= t <= 6 for t in times]
    rows = [
        (
            t,
            "gpu01",
            0,
            UUIDS[0],
            "NVIDIA H100",
            0,
            (sm_inside if b else 5.0) if gpm else None,
            100 if b else 20,
            40,
            power if b else 100.0,
            700.0,
            (power if b else 100.0) / 700,
            9000.0 if b else 0.0,
            1000.0,
            2500.0,
            60,
            1,  # processes: the job's own
            0,
            0.0,
            3.5,  # host load, host CPUs
            16,
            None,  # energy_j: no counter
        )
        for t, b in zip(times, busy, strict=True)
    ]
    return pd.DataFrame(rows, columns=COLUMNS)


def test_only_samples_in_the_measurement_window_count(tmp_path):
    windowed = _run_folder(tmp_path, "strong/w1_r0", _frame(), window=(3.0, 6.0))
    whole = _run_folder(tmp_path, "strong/w2_r0", _frame())
    samples, reasons = monitor_window.load([windowed, whole])
    assert reasons == [] and set(samples.run) == {"scaling/strong/w1_r0", "scaling/strong/w2_r0"}
    gpus = monitor_window.per_gpu(samples).set_index("run")
    inside, whole_run = gpus.loc["scaling/strong/w1_r0"], gpus.loc["scaling/strong/w2_r0"]
    assert (
        inside.samples == 4 and inside.sm_active_pct == 85.0 and inside.pcie_gb_s == 10.0 and inside.windowed
    )
    assert whole_run.samples == 10 and not whole_run.windowed  # no window recorded: the whole run
    assert whole_run.sm_active_pct == pytest.approx((4 * 85 + 6 * 5) / 10) and whole_run.world_size == 2


def test_an_unfilled_window_falls_back_to_the_whole_run(tmp_path):
    path = _run_folder(tmp_path, "strong/w1_r0", _frame(), window=(3.0, 6.0))
    atomic.write_json(
        path.with_name("summary.json"), {"results": {"measure_start_s": None, "measure_end_s": None}}
    )
    assert monitor_window.measurement_window(path) is None
    assert monitor_window.load([path])[0]["in_window"].all()


def test_pauses_inside_the_window_are_left_out(tmp_path):
    """An epoch end inside the window (evaluation, checkpoint): only the unpaused segments count."""
    path = _run_folder(tmp_path, "strong/w1_r0", _frame(), window=(3.0, 6.0))
    summary = path.with_name("summary.json")
    results = json.loads(summary.read_text())["results"]
    atomic.write_json(summary, {"results": {**results, "measure_segments_s": [[3.0, 3.5], [4.5, 6.0]]}})
    assert monitor_window.measurement_window(path) == [(3.0, 3.5), (4.5, 6.0)]
    frame = monitor_window.load([path])[0]
    assert list(frame.loc[frame["in_window"], "time_s"]) == [
        t for t in frame["time_s"] if 3.0 <= t <= 3.5 or 4.5 <= t <= 6.0
    ]
    assert frame["in_window"].sum() < 4  # fewer than the whole window's samples


def test_a_window_of_an_earlier_attempt_leaves_the_gpus_not_measured(tmp_path):
    path = _run_folder(tmp_path, "strong/w1_r0", _frame(), window=(3.0, 6.0))
    atomic.write_json(
        path.with_name("summary.json"),
        {
            "results": {
                "window_filled": True,
                "measure_start_s": None,
                "measure_end_s": None,
                "measure_segments_s": None,
            }
        },
    )
    assert monitor_window.measurement_window(path) == []
    samples = monitor_window.load([path])[0]
    assert not samples["in_window"].any()
    assert monitor_window.per_gpu(samples).empty


# the constructed windows below hold 4 samples (3 s..6 s at 1 s): judged here with a floor of 4
MONITOR = {**settings.resolved({})["monitor"], "min_window_samples": 4}
CRITERIA = settings.resolved({})["acceptance"]


def _health(paths, thresholds=MONITOR):
    samples, reasons = monitor_window.load(paths)
    rows = acceptance.gpu_health(monitor_window.per_gpu(samples), thresholds, reasons)
    return pd.DataFrame(rows).set_index("criterion")


def test_acceptance_rows_pass_and_fail_on_the_window(tmp_path):
    good = _run_folder(tmp_path, "strong/w1_r0", _frame(sm_inside=95.0), window=(3.0, 6.0))
    table = _health([good])
    assert list(table.status) == ["pass", "pass", "pass"]
    sm = table.loc["SM activity (NVML GPM) of the least loaded GPU"]
    assert sm.measured == pytest.approx(0.95) and sm.target == ">= 90%" and "measurement window" in sm.note
    assert table.loc["power draw / power limit of the least loaded GPU"].measured == pytest.approx(400 / 700)
    slow = _run_folder(tmp_path, "strong/w2_r0", _frame(sm_inside=60.0, power=200.0), window=(3.0, 6.0))
    table = _health([good, slow], {**MONITOR, "power_w_min": 300.0, "pcie_gb_s_max": 5.0})
    assert list(table.status) == ["fail"] * 4 and table.iloc[0].world_size == 2
    assert table.loc["power draw of the least loaded GPU"].measured == 200.0
    assert "scaling/strong/w2_r0" in table.iloc[0].note


def test_acceptance_says_not_measured_without_gpm_or_without_gpu(tmp_path):
    no_gpm = _run_folder(tmp_path, "strong/w1_r0", _frame(gpm=False), window=(3.0, 6.0))
    sm = _health([no_gpm]).iloc[0]
    assert sm.status == "not measured (sm_active_pct unsupported)" and "no NVML GPM" in sm.note
    assert "was 100-100%" in sm.note  # the kernel-activity figure is shown, not taken for SM activity
    cpu = _run_folder(tmp_path, "strong/w2_r0", pd.DataFrame(columns=list(COLUMNS)))
    atomic.write_json(
        cpu.with_name("gpu_monitor.json"), {"available": False, "reason": "no NVIDIA GPU (device cpu)"}
    )
    table = _health([cpu])
    assert set(table.status) == {"not measured"} and all("device cpu" in note for note in table.note)


def test_acceptance_html_shows_absolute_units():
    assert acceptance._cell(12.345, "measured", "<= 20 GB/s") == "12.3 GB/s"
    assert acceptance._cell(0.93, "measured", ">= 90%") == "93.0%"
    empty = pd.DataFrame(columns=["mode", "world_size", "efficiency_mean", "time_per_step_s_mean"])
    sensitivity = pd.DataFrame(columns=["gain_vs_baseline", "images_per_s_per_gpu"])
    table = acceptance.evaluate(empty, sensitivity, CRITERIA, None, MONITOR)
    assert "SM activity (NVML GPM) of the least loaded GPU" in set(table.criterion)
    assert len(acceptance.evaluate(empty, sensitivity, CRITERIA)) == 3  # without monitor settings: no rows
