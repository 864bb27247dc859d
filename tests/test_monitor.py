"""The NVML sampler against a stand-in NVML (tests/monitor_helpers.py): which GPU a rank samples,
what it samples, its files, and its energy counter. The analysis of the samples is in
tests/test_monitor_window.py, the GPU's other processes in tests/test_monitor_processes.py."""

import json
import logging
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from scalestudy.plan.runfiles import MONITOR_COLUMNS as COLUMNS
from scalestudy.train import energy_counter, gpu_monitor_files
from scalestudy.train import gpu_monitor as monitor
from scalestudy.train.gpu_monitor import GpuMonitor
from tests.conftest import REPO
from tests.gpufake import FAKE_NVML_DIR
from tests.monitor_helpers import UUIDS, FakeNvml, rows_of, sampled

# -- which GPU --


def test_uuid_forms_match():
    torch_form = "0A1B2C3D-0000-1111-2222-333344446666"  # str(get_device_properties(d).uuid): no prefix
    assert monitor.uuid_key(torch_form) == monitor.uuid_key(UUIDS[1]) == UUIDS[1][4:]
    assert monitor.uuid_key(b"GPU-ABC") == "abc"


def test_a_rank_samples_its_torch_device_by_uuid_not_by_index(monkeypatch):
    """CUDA_VISIBLE_DEVICES=2 makes the rank's cuda:0 NVML's GPU 2: the UUID finds it."""
    properties = SimpleNamespace(uuid=UUIDS[2][4:])  # torch prints the UUID without "GPU-"
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: properties)
    assert monitor.device_uuid(torch.device("cuda", 0)) == UUIDS[2]
    nvml = FakeNvml()
    node = monitor.for_device(torch.device("cuda", 0), 0.1, t0=0.0, rank=5, nvml=nvml)
    assert node.open()
    node.sample(0.0)
    report = node.stop()
    rows = rows_of(report)
    assert list(rows.gpu_index) == [2] and list(rows.gpu_uuid) == [UUIDS[2]] and list(rows["rank"]) == [5]
    assert report["available"] and report["reason"] is None and not nvml.initialised


def test_a_gpu_nvml_does_not_show_is_reported():
    nvml = FakeNvml()
    node = GpuMonitor(host="gpu01", gpu_uuids=["GPU-ffffffff-0000-0000-0000-000000000000"], nvml=nvml).start()
    report = node.stop()
    assert not report["available"] and report["rows"] == [] and not nvml.initialised
    assert "no NVML GPU on gpu01 has UUID GPU-ffffffff" in report["reason"]


def test_a_cpu_rank_samples_nothing_and_says_why():
    report = monitor.for_device(torch.device("cpu"), 0.1).start().stop()
    assert report == {**report, "available": False, "reason": "no NVIDIA GPU (device cpu)", "rows": []}


def test_without_nvml_the_run_folder_says_why(tmp_path):
    node = GpuMonitor(interval_s=0.01, host="gpu-node", gpu_uuids=[UUIDS[0]]).start()  # the real pynvml
    report = node.stop()
    assert not report["available"] and "NVML unavailable on gpu-node" in report["reason"]
    gpu_monitor_files.write_outputs(tmp_path, [report, None], interval_s=0.01)
    assert (tmp_path / "gpu_monitor.csv").read_text() == ",".join(COLUMNS) + "\n"
    summary = json.loads((tmp_path / "gpu_monitor.json").read_text())
    assert summary["available"] is False and "gpu-node" in summary["reason"]


# -- what is sampled --


def test_gpm_sm_activity_power_fraction_and_units():
    nvml = FakeNvml()
    report = sampled(nvml, [0.0, 0.1, 0.2, 0.3, 0.4], gpu_uuids=[UUIDS[0]])
    rows = rows_of(report)
    # GPM needs > 100 ms between its samples: values at 0.2 (0.0 -> 0.2) and 0.4 (0.2 -> 0.4)
    assert (
        rows.sm_active_pct.tolist()[2::2] == [71.5, 71.5] and rows.sm_active_pct.iloc[[0, 1, 3]].isna().all()
    )
    first = rows.iloc[0]
    assert (first.kernel_active_pct, first.mem_util_pct, first.power_w, first.power_limit_w) == (
        99,
        40,
        350.5,
        700,
    )
    assert first.power_fraction == pytest.approx(350.5 / 700)
    assert (first.pcie_rx_mb_s, first.pcie_tx_mb_s, first.mem_used_mb, first.temperature_c) == (
        12,
        3,
        2500,
        61,
    )
    assert first.gpu_name == "NVIDIA H100 80GB HBM3"  # bytes from an older pynvml decoded
    assert report["gpus"][0]["gpm_supported"] is True and nvml.samples_alive == 0  # GPM buffers freed


def test_without_gpm_sm_activity_is_empty_and_kernel_activity_stays():
    report = sampled(FakeNvml(gpm=(False, False, False)), [0.0, 0.2, 0.4], gpu_uuids=[UUIDS[1]])
    rows = rows_of(report)
    assert rows.sm_active_pct.isna().all() and (rows.kernel_active_pct == 99).all()
    assert (
        report["gpus"][0]["gpm_supported"] is False and "GPM not supported" in report["gpus"][0]["gpm_reason"]
    )


def test_power_fraction_known_answers():
    assert monitor.power_fraction(350.0, 700.0) == 0.5
    assert monitor.power_fraction(350.0, 350.0) == 1.0
    assert monitor.power_fraction(350.0, None) is None and monitor.power_fraction(None, 700.0) is None
    assert monitor.power_fraction(350.0, 0.0) is None


def test_an_unsupported_counter_is_empty_and_counted():
    report = sampled(FakeNvml(no_pcie=(0,)), [0.0, 0.2], gpu_uuids=[UUIDS[0]])
    rows = rows_of(report)
    assert rows.pcie_rx_mb_s.isna().all() and rows.power_w.notna().all()
    assert report["gpus"][0]["errors"] == {"pcie_rx": "Not Supported (2x)", "pcie_tx": "Not Supported (2x)"}
    assert report["gpus"][0]["failed"] is None


def test_other_jobs_gpus_are_skipped_quietly_and_a_missing_own_gpu_is_still_reported(caplog):
    """Under Slurm's device cgroup NVML counts the node's GPUs but may not open other jobs' ones."""
    nvml = FakeNvml(not_ours=(0, 2))
    with caplog.at_level(logging.WARNING, logger=monitor.log.name):
        report = sampled(nvml, [0.0, 0.2], gpu_uuids=[UUIDS[1]])
    assert report["available"] and report["reason"] is None and caplog.records == []
    assert set(rows_of(report).gpu_index) == {1}
    mine_hidden = GpuMonitor(host="gpu01", gpu_uuids=[UUIDS[0]], nvml=FakeNvml(not_ours=(0,))).start().stop()
    assert not mine_hidden["available"] and f"has UUID {UUIDS[0]}" in mine_hidden["reason"]


def test_one_failing_gpu_is_reported_and_skipped_the_others_go_on():
    nvml = FakeNvml(lost_after={1: 3}, bad_handle=(2,))  # GPU 1 is lost at its 3rd sample; GPU 2 unreadable
    report = sampled(nvml, [0.0, 0.2, 0.4, 0.6], gpu_uuids=None)  # None: every GPU NVML shows
    rows = rows_of(report)
    assert rows.groupby("gpu_index").size().to_dict() == {0: 4, 1: 2}
    gpus = {gpu["index"]: gpu for gpu in report["gpus"]}
    assert (
        gpus[0]["failed"] is None and "GPU is lost" in gpus[1]["failed"] and "at 0.4 s" in gpus[1]["failed"]
    )
    assert "NVML GPU 2: error 999" in report["reason"] and report["available"]


def test_the_thread_samples_at_the_set_rate():
    nvml = FakeNvml()
    node = GpuMonitor(interval_s=0.05, t0=time.time(), host="gpu01", gpu_uuids=[UUIDS[0]], nvml=nvml).start()
    time.sleep(0.5)
    report = node.stop()
    rows = rows_of(report)
    # ~10 samples, and one more when it stops: the run's end, for the energy counter
    assert 5 <= len(rows) <= 13 and rows.time_s.is_monotonic_increasing and 0 <= rows.time_s.iloc[0] < 0.5
    assert rows.time_s.iloc[-1] >= 0.45
    assert rows.sm_active_pct.notna().sum() >= 2 and not nvml.initialised
    rows_after_stop = len(report["rows"])
    time.sleep(0.15)
    assert len(node.rows) == rows_after_stop


def test_interval_must_be_positive():
    with pytest.raises(ValueError, match="monitor_interval_s"):
        GpuMonitor(interval_s=0)


def test_ranks_are_merged_into_one_csv_and_grouped_by_node(tmp_path):
    reports = [sampled(FakeNvml(), [0.3, 0.1], gpu_uuids=[UUIDS[rank]], rank=rank) for rank in (0, 1)] + [
        GpuMonitor(host="gpu02", rank=2, no_gpu_reason="no NVIDIA GPU (device cpu)").start().stop()
    ]
    reports[2]["host"] = "gpu02"
    gpu_monitor_files.write_outputs(tmp_path, [reports[1], None, reports[0], reports[2]], interval_s=0.1)
    merged = pd.read_csv(tmp_path / "gpu_monitor.csv")
    assert list(merged.columns) == list(COLUMNS) and len(merged) == 4
    assert merged.time_s.is_monotonic_increasing and list(merged.gpu_index[:2]) == [0, 1]
    summary = json.loads((tmp_path / "gpu_monitor.json").read_text())
    nodes = {node["host"]: node for node in summary["nodes"]}
    assert (
        nodes["gpu01"]["ranks"] == [1, 0] and len(nodes["gpu01"]["gpus"]) == 2 and nodes["gpu01"]["available"]
    )
    assert nodes["gpu02"]["available"] is False and "rank 2: no NVIDIA GPU" in nodes["gpu02"]["reason"]
    assert summary["available"] is False and summary["sm_active"] == "NVML GPM (NVML_GPM_METRIC_SM_UTIL)"


# -- the energy counter (scalestudy.train.energy_counter) --

TIMES = [round(0.1 * k, 1) for k in range(11)]  # 0.0 .. 1.0 s


def _energy_j(nvml, times=TIMES, uuid=UUIDS[0]):
    report = sampled(nvml, times, gpu_uuids=[uuid])
    return rows_of(report)["energy_j"].tolist(), report["gpus"][0]["energy"]


def test_the_counter_gives_joules_since_the_first_reading():
    """412 W on the counter (the power readings say 350.5 W: the counter is what counts)."""
    readings = [7_000_000] + [7_000_000 + round(412_000 * t) for t in TIMES]  # the first: open's check
    joules, report = _energy_j(FakeNvml(energy={0: readings}))
    assert joules == pytest.approx([412.0 * t for t in TIMES])
    assert report == {"counter": True, "reason": None, "wraps": 0, "resets": []}


def test_a_counter_that_wraps_at_two_to_the_64_goes_on_counting():
    start = 2**64 - 100_000  # 100 J below the top: it wraps between 0.2 s and 0.3 s at 412 W
    readings = [start] + [(start + round(412_000 * t)) % 2**64 for t in TIMES]
    joules, report = _energy_j(FakeNvml(energy={0: readings}))
    assert readings[4] < readings[3]  # the wrap is in the data
    assert joules == pytest.approx([412.0 * t for t in TIMES])
    assert report["wraps"] == 1 and report["resets"] == []


def test_a_counter_reset_by_a_driver_reload_is_bridged_by_the_power_samples():
    """The counter restarts near zero between 0.5 s and 0.6 s: that interval counts the power
    readings' trapezoid (350.5 W x 0.1 s), the others the counter (412 W)."""
    before = [9_000_000 + round(412_000 * t) for t in TIMES[:6]]
    after = [5 + round(412_000 * (t - 0.6)) for t in TIMES[6:]]
    joules, report = _energy_j(FakeNvml(energy={0: [before[0], *before, *after]}))
    expected_end = 412.0 * 0.5 + 350.5 * 0.1 + 412.0 * 0.4
    assert joules[5] == pytest.approx(412.0 * 0.5) and joules[6] == pytest.approx(412.0 * 0.5 + 35.05)
    assert joules[-1] == pytest.approx(expected_end)
    assert report["resets"] == [{"at_s": 0.6, "bridged_by": "power samples"}] and report["wraps"] == 0


def test_a_reset_without_power_samples_counts_the_new_reading_as_a_lower_bound():
    counter = energy_counter.EnergyCounter(power_limit_w=700.0)
    assert counter.add(0.0, 50_000_000, None) == 0.0
    assert counter.add(0.1, 50_041_200, None) == pytest.approx(41.2)
    assert counter.add(0.2, 30_000, None) == pytest.approx(41.2 + 30.0)  # reset: 30 J since the reload
    assert counter.resets[0]["bridged_by"].startswith("the new reading")
    assert counter.add(0.3, None, None) is None  # no reading: the value is empty, the total kept
    assert counter.add(0.4, 71_200, None) == pytest.approx(41.2 + 30.0 + 41.2)


def test_a_gpu_without_the_counter_leaves_energy_empty_and_says_why(tmp_path):
    nvml = FakeNvml(no_energy=(1,))
    report = sampled(nvml, TIMES, gpu_uuids=[UUIDS[1]])
    assert rows_of(report)["energy_j"].isna().all() and rows_of(report)["power_w"].notna().all()
    gpu = report["gpus"][0]
    assert gpu["energy"]["counter"] is False and "Not Supported" in gpu["energy"]["reason"]
    assert nvml.energy_calls[1] == 0 and gpu["errors"] == {}  # asked once at open, not at every sample
    gpu_monitor_files.write_outputs(tmp_path, [report], interval_s=0.1)
    summary = json.loads((tmp_path / "gpu_monitor.json").read_text())
    assert summary["energy"].startswith("power samples integrated on " + UUIDS[1])


def test_the_monitor_notes_the_counter_when_every_gpu_has_one(tmp_path):
    gpu_monitor_files.write_outputs(
        tmp_path, [sampled(FakeNvml(), TIMES, gpu_uuids=[UUIDS[0]])], interval_s=0.1
    )
    assert json.loads((tmp_path / "gpu_monitor.json").read_text())["energy"] == "NVML total energy counter"


def test_the_fake_pynvml_module_drives_the_monitor_in_a_subprocess(tmp_path):
    """tests/fakenvml/pynvml.py as `import pynvml` finds it: energy and power from its state file,
    changed between samples as a job's GPU would change them."""
    state = tmp_path / "nvml.json"
    gpu = {"uuid": UUIDS[0], "name": "NVIDIA H100", "power_limit_mw": 700_000}
    state.write_text(json.dumps({"gpus": [{**gpu, "energy_mj": 1_000_000, "power_mw": 400_000}]}))
    script = f"""
import json, pathlib
from scalestudy.train import gpu_monitor, gpu_monitor_files
state = pathlib.Path({str(state)!r})
node = gpu_monitor.GpuMonitor(interval_s=0.1, t0=0.0, host="gpu01", gpu_uuids=[{UUIDS[0]!r}])
assert node.open(), node.reason
for now, mj in ((0.0, 1_000_000), (1.0, 1_400_000), (2.0, 1_800_000)):
    machine = json.loads(state.read_text())
    machine["gpus"][0]["energy_mj"] = mj
    state.write_text(json.dumps(machine))
    node.sample(now)
gpu_monitor_files.write_outputs({str(tmp_path)!r}, [node.stop()], 0.1)
"""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(FAKE_NVML_DIR), str(REPO)]),
        "SCALESTUDY_FAKE_NVML": str(state),
    }
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    rows = pd.read_csv(tmp_path / "gpu_monitor.csv")
    assert rows["energy_j"].tolist() == [0.0, 400.0, 800.0] and (rows["power_w"] == 400.0).all()
    assert json.loads((tmp_path / "gpu_monitor.json").read_text())["energy"] == "NVML total energy counter"
