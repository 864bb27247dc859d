"""The NVML sampler against a stand-in NVML, its files, and the analysis of its samples."""

import json
import logging
import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from scalestudy import atomic
from scalestudy.analysis import acceptance, monitor_window, settings
from scalestudy.train import energy_counter, gpu_processes
from scalestudy.train import gpu_monitor as monitor
from scalestudy.train.gpu_monitor import COLUMNS, GpuMonitor
from tests.conftest import REPO
from tests.gpufake import FAKE_NVML_DIR

UUIDS = (
    "GPU-0a1b2c3d-0000-1111-2222-333344445555",
    "GPU-0a1b2c3d-0000-1111-2222-333344446666",
    "GPU-0a1b2c3d-0000-1111-2222-333344447777",
)
SM_ACTIVE = (71.5, 64.0, 80.0)  # what the stand-in's GPM reports per GPU


class FakeNvml:
    """The pynvml calls the monitor makes, for three GPUs (with pynvml's constants).

    gpm: per GPU whether nvmlGpmQueryDeviceSupport says yes. lost_after: {GPU: n} raises
    NVML_ERROR_GPU_IS_LOST from the n-th power reading on. no_pcie: GPUs without PCIe counters.
    energy: {GPU: [mJ, ...]} the energy counter's readings in turn (the first is the monitor's check
    at open); without, the counter rises by the power reading x 0.1 s per reading. no_energy: GPUs
    without the counter (NVML_ERROR_NOT_SUPPORTED, as before Volta). power_w: the power readings.
    """

    NVML_PCIE_UTIL_TX_BYTES, NVML_PCIE_UTIL_RX_BYTES, NVML_TEMPERATURE_GPU = 0, 1, 0
    NVML_SUCCESS, NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_NO_PERMISSION, NVML_ERROR_GPU_IS_LOST = 0, 3, 4, 15
    NVML_GPM_METRICS_GET_VERSION, NVML_GPM_METRIC_SM_UTIL = 1, 2

    class NVMLError(Exception):
        def __init__(self, value):
            super().__init__({3: "Not Supported", 15: "GPU is lost"}.get(value, f"error {value}"))
            self.value = value

    def __init__(
        self,
        gpm=(True, True, True),
        lost_after=None,
        no_pcie=(),
        bad_handle=(),
        not_ours=(),
        energy=None,
        no_energy=(),
        power_w=(350.5, 351.5, 352.5),
    ):
        self.gpm, self.lost_after, self.no_pcie, self.bad_handle = gpm, lost_after or {}, no_pcie, bad_handle
        self.not_ours = not_ours  # GPUs of other jobs: NVML_ERROR_NO_PERMISSION (Slurm's device cgroup)
        self.energy, self.no_energy, self.power_w = energy, no_energy, power_w
        self.energy_calls = [0, 0, 0]
        self.initialised = False
        self.power_calls = [0, 0, 0]
        self.gpm_counter = 0
        self.samples_alive = 0

    def nvmlInit(self):
        self.initialised = True

    def nvmlShutdown(self):
        self.initialised = False

    def nvmlDeviceGetCount(self):
        return len(UUIDS)

    def nvmlDeviceGetHandleByIndex(self, index):
        if index in self.bad_handle:
            raise self.NVMLError(999)
        if index in self.not_ours:
            raise self.NVMLError(self.NVML_ERROR_NO_PERMISSION)
        return index

    def nvmlDeviceGetUUID(self, handle):
        return UUIDS[handle]  # pynvml 13 returns str (older ones bytes)

    def nvmlDeviceGetName(self, handle):
        return b"NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetEnforcedPowerLimit(self, handle):
        return 700_000  # mW

    def nvmlDeviceGetUtilizationRates(self, handle):
        return SimpleNamespace(gpu=99, memory=40)

    def nvmlDeviceGetPowerUsage(self, handle):
        self.power_calls[handle] += 1
        if handle in self.lost_after and self.power_calls[handle] >= self.lost_after[handle]:
            raise self.NVMLError(self.NVML_ERROR_GPU_IS_LOST)
        return round(self.power_w[handle] * 1000)  # mW

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        if handle in self.no_energy:
            raise self.NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        calls = self.energy_calls[handle]
        self.energy_calls[handle] += 1
        if self.energy is None:
            return 10**9 + round(self.power_w[handle] * 100) * calls  # mJ: power x 0.1 s per reading
        return self.energy[handle][calls]

    def nvmlDeviceGetPcieThroughput(self, handle, counter):
        if handle in self.no_pcie:
            raise self.NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        return 12_000 if counter == self.NVML_PCIE_UTIL_RX_BYTES else 3_000  # KB/s

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(used=2_500_000_000, total=80_000_000_000)

    def nvmlDeviceGetTemperature(self, handle, sensor):
        return 61

    # GPM
    def nvmlGpmQueryDeviceSupport(self, handle):
        return SimpleNamespace(isSupportedDevice=int(self.gpm[handle]))

    def nvmlGpmSampleAlloc(self):
        self.samples_alive += 1
        return SimpleNamespace(device=None, counter=None)

    def nvmlGpmSampleFree(self, sample):
        self.samples_alive -= 1

    def nvmlGpmSampleGet(self, handle, sample):
        self.gpm_counter += 1
        sample.device, sample.counter = handle, self.gpm_counter
        return sample

    @staticmethod
    def c_nvmlGpmMetricsGet_t():
        metrics = [SimpleNamespace(metricId=0, nvmlReturn=-1, value=0.0) for _ in range(4)]
        return SimpleNamespace(version=0, numMetrics=0, sample1=None, sample2=None, metrics=metrics)

    def nvmlGpmMetricsGet(self, request):
        one, two = request.sample1, request.sample2
        assert request.version == 1 and request.numMetrics == 1 and one is not two
        assert one.device == two.device and one.counter < two.counter  # two samples of one GPU, in order
        metric = request.metrics[0]
        assert metric.metricId == self.NVML_GPM_METRIC_SM_UTIL
        metric.nvmlReturn, metric.value = self.NVML_SUCCESS, SM_ACTIVE[one.device]
        return request


class ProcessNvml(FakeNvml):
    """FakeNvml with NVML's process queries: `running` {GPU: [(pid, used bytes or None)]}, changed by
    the test between samples. `forms`: the suffixes of nvmlDeviceGetComputeRunningProcesses the
    driver has ("" is the v3 one nvidia-ml-py 12+ calls unsuffixed); the others answer
    NVML_ERROR_FUNCTION_NOT_FOUND, as an older driver does. `mps`: MPS clients per GPU."""

    NVML_ERROR_FUNCTION_NOT_FOUND = 13

    def __init__(self, running=None, forms=("", "_v3", "_v2"), mps=None, **kwargs):
        super().__init__(**kwargs)
        self.running, self.forms, self.mps = running or {}, forms, mps or {}
        self.process_calls = 0

    def _listed(self, form, handle, table):
        if form not in self.forms:
            raise self.NVMLError(self.NVML_ERROR_FUNCTION_NOT_FOUND)
        self.process_calls += 1
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in table.get(handle, [])]

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return self._listed("", handle, self.running)

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle):
        return self._listed("_v3", handle, self.running)

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle):
        return self._listed("_v2", handle, self.running)

    def nvmlDeviceGetMPSComputeRunningProcesses(self, handle):
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in self.mps.get(handle, [])]


def _rows(report) -> pd.DataFrame:
    return pd.DataFrame(report["rows"], columns=COLUMNS)


def _sampled(nvml, times, **kwargs):
    """A monitor opened on `nvml` and sampled at the given times (no thread), then stopped."""
    node = GpuMonitor(interval_s=0.1, t0=0.0, host="gpu01", nvml=nvml, **kwargs)
    assert node.open()
    for now in times:
        node.sample(now)
    return node.stop()


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
    rows = _rows(report)
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
    monitor.write_outputs(tmp_path, [report, None], interval_s=0.01)
    assert (tmp_path / "gpu_monitor.csv").read_text() == ",".join(COLUMNS) + "\n"
    summary = json.loads((tmp_path / "gpu_monitor.json").read_text())
    assert summary["available"] is False and "gpu-node" in summary["reason"]


# -- what is sampled --


def test_gpm_sm_activity_power_fraction_and_units():
    nvml = FakeNvml()
    report = _sampled(nvml, [0.0, 0.1, 0.2, 0.3, 0.4], gpu_uuids=[UUIDS[0]])
    rows = _rows(report)
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
    report = _sampled(FakeNvml(gpm=(False, False, False)), [0.0, 0.2, 0.4], gpu_uuids=[UUIDS[1]])
    rows = _rows(report)
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
    report = _sampled(FakeNvml(no_pcie=(0,)), [0.0, 0.2], gpu_uuids=[UUIDS[0]])
    rows = _rows(report)
    assert rows.pcie_rx_mb_s.isna().all() and rows.power_w.notna().all()
    assert report["gpus"][0]["errors"] == {"pcie_rx": "Not Supported (2x)", "pcie_tx": "Not Supported (2x)"}
    assert report["gpus"][0]["failed"] is None


def test_other_jobs_gpus_are_skipped_quietly_and_a_missing_own_gpu_is_still_reported(caplog):
    """Under Slurm's device cgroup NVML counts the node's GPUs but may not open other jobs' ones."""
    nvml = FakeNvml(not_ours=(0, 2))
    with caplog.at_level(logging.WARNING, logger=monitor.log.name):
        report = _sampled(nvml, [0.0, 0.2], gpu_uuids=[UUIDS[1]])
    assert report["available"] and report["reason"] is None and caplog.records == []
    assert set(_rows(report).gpu_index) == {1}
    mine_hidden = GpuMonitor(host="gpu01", gpu_uuids=[UUIDS[0]], nvml=FakeNvml(not_ours=(0,))).start().stop()
    assert not mine_hidden["available"] and f"has UUID {UUIDS[0]}" in mine_hidden["reason"]


def test_one_failing_gpu_is_reported_and_skipped_the_others_go_on():
    nvml = FakeNvml(lost_after={1: 3}, bad_handle=(2,))  # GPU 1 is lost at its 3rd sample; GPU 2 unreadable
    report = _sampled(nvml, [0.0, 0.2, 0.4, 0.6], gpu_uuids=None)  # None: every GPU NVML shows
    rows = _rows(report)
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
    rows = _rows(report)
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
    reports = [_sampled(FakeNvml(), [0.3, 0.1], gpu_uuids=[UUIDS[rank]], rank=rank) for rank in (0, 1)] + [
        GpuMonitor(host="gpu02", rank=2, no_gpu_reason="no NVIDIA GPU (device cpu)").start().stop()
    ]
    reports[2]["host"] = "gpu02"
    monitor.write_outputs(tmp_path, [reports[1], None, reports[0], reports[2]], interval_s=0.1)
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
    report = _sampled(nvml, times, gpu_uuids=[uuid])
    return _rows(report)["energy_j"].tolist(), report["gpus"][0]["energy"]


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
    report = _sampled(nvml, TIMES, gpu_uuids=[UUIDS[1]])
    assert _rows(report)["energy_j"].isna().all() and _rows(report)["power_w"].notna().all()
    gpu = report["gpus"][0]
    assert gpu["energy"]["counter"] is False and "Not Supported" in gpu["energy"]["reason"]
    assert nvml.energy_calls[1] == 0 and gpu["errors"] == {}  # asked once at open, not at every sample
    monitor.write_outputs(tmp_path, [report], interval_s=0.1)
    summary = json.loads((tmp_path / "gpu_monitor.json").read_text())
    assert summary["energy"].startswith("power samples integrated on " + UUIDS[1])


def test_the_monitor_notes_the_counter_when_every_gpu_has_one(tmp_path):
    monitor.write_outputs(tmp_path, [_sampled(FakeNvml(), TIMES, gpu_uuids=[UUIDS[0]])], interval_s=0.1)
    assert json.loads((tmp_path / "gpu_monitor.json").read_text())["energy"] == "NVML total energy counter"


def test_the_fake_pynvml_module_drives_the_monitor_in_a_subprocess(tmp_path):
    """tests/fakenvml/pynvml.py as `import pynvml` finds it: energy and power from its state file,
    changed between samples as a job's GPU would change them."""
    state = tmp_path / "nvml.json"
    gpu = {"uuid": UUIDS[0], "name": "NVIDIA H100", "power_limit_mw": 700_000}
    state.write_text(json.dumps({"gpus": [{**gpu, "energy_mj": 1_000_000, "power_mw": 400_000}]}))
    script = f"""
import json, pathlib
from scalestudy.train import gpu_monitor
state = pathlib.Path({str(state)!r})
node = gpu_monitor.GpuMonitor(interval_s=0.1, t0=0.0, host="gpu01", gpu_uuids=[{UUIDS[0]!r}])
assert node.open(), node.reason
for now, mj in ((0.0, 1_000_000), (1.0, 1_400_000), (2.0, 1_800_000)):
    machine = json.loads(state.read_text())
    machine["gpus"][0]["energy_mj"] = mj
    state.write_text(json.dumps(machine))
    node.sample(now)
gpu_monitor.write_outputs({str(tmp_path)!r}, [node.stop()], 0.1)
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


# -- the analysis: measurement window and acceptance --


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


# -- what else runs on the GPU (scalestudy.train.gpu_processes) --

ME = os.getpid()
STRANGER, OTHER = 9_000_001, 9_000_002  # above Linux's pid_max: no /proc entry, never the job's


def _watched(nvml, steps, job=None, uuid=UUIDS[0]):
    """A monitor of one GPU sampled once per (time, running) step: NVML lists `running` then."""
    node = GpuMonitor(interval_s=0.1, t0=0.0, host="gpu01", gpu_uuids=[uuid], nvml=nvml, job=job)
    assert node.open()
    for now, running in steps:
        nvml.running = running
        node.sample(now)
    return node.stop()


def test_a_foreign_process_is_counted_with_its_memory_and_the_jobs_own_is_not():
    nvml = ProcessNvml()
    job = monitor.JobProcesses(frozenset({ME}))
    steps = [
        (0.0, {0: [(ME, 2_000_000_000), (STRANGER, 3_100_000_000)]}),
        (0.2, {0: [(ME, 2_000_000_000)]}),
        (0.4, {0: [(ME, 2_000_000_000), (STRANGER, 3_000_000_000), (OTHER, 500_000_000)]}),
    ]
    report = _watched(nvml, steps, job)
    rows = _rows(report)
    assert rows.processes.tolist() == [2, 1, 3] and rows.foreign_processes.tolist() == [1, 0, 2]
    assert rows.foreign_mem_mb.tolist() == [3100.0, 0.0, 3500.0]
    assert rows.host_cpus.eq(os.cpu_count()).all() and rows.host_load_1m.notna().all()
    processes = report["gpus"][0]["processes"]
    spans = [
        (s["pid"], s["first_s"], s["last_s"], s["samples"], s["identified"]) for s in processes["foreign"]
    ]
    # the stranger left between 0.0 and 0.4: two sightings, so a window in between does not meet it
    assert spans == [(STRANGER, 0.0, 0.0, 1, True), (STRANGER, 0.4, 0.4, 1, True), (OTHER, 0.4, 0.4, 1, True)]
    assert processes["pid_namespace_samples"] == 0 and report["process_query"].startswith("NVML nvmlDevice")
    assert report["cpus"] == sorted(os.sched_getaffinity(0))


def test_the_jobs_other_ranks_and_their_children_are_its_own(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    # outside this process's tree (setsid -f: reparented), as another job's process is
    outsider = subprocess.Popen(
        ["setsid", "-f", "sh", "-c", "echo $$; exec sleep 30"], stdout=subprocess.PIPE
    )
    outsider_pid = int(outsider.stdout.readline())
    outsider.wait(timeout=30)  # setsid's own process gone: the sleep is reparented, out of our tree
    try:
        ranks = [
            {"host": "gpu01", "pid": ME, "gpu_uuid": UUIDS[0][4:]},  # torch's form of the UUID
            {"host": "gpu01", "pid": STRANGER + 5, "gpu_uuid": UUIDS[1]},  # another rank, another GPU
            {"host": "gpu02", "pid": OTHER, "gpu_uuid": UUIDS[0]},  # a rank of another host: not here
        ]
        job = monitor.job_on_host(ranks, "gpu01")
        assert job.pids == {ME, STRANGER + 5} and job.expected_on(UUIDS[0]) == 1
        running = {0: [(ME, 10), (STRANGER + 5, 10), (child.pid, 10), (OTHER, 10), (outsider_pid, 10)]}
        report = _watched(ProcessNvml(), [(0.0, running)], job)
        rows = _rows(report)
        # a rank of this job with a context on this GPU and a child of a rank (a compile worker) are
        # the job's; the same pid on another host is a stranger here, as is a process of another tree
        assert (rows.processes[0], rows.foreign_processes[0]) == (5, 2)
        assert {s["pid"] for s in report["gpus"][0]["processes"]["foreign"]} == {OTHER, outsider_pid}
    finally:
        child.kill()
        child.wait()
        os.kill(outsider_pid, signal.SIGKILL)
        outsider.wait()


def test_the_mps_server_is_not_foreign_and_mps_clients_are(tmp_path):
    (tmp_path / str(STRANGER)).mkdir()
    (tmp_path / str(STRANGER) / "comm").write_text("nvidia-cuda-mps-server\n")
    watch = gpu_processes.Processes(
        ProcessNvml(mps={0: [(OTHER, None)]}), gpu_processes.this_process(), tmp_path
    )
    nvml = watch.compute.nvml
    nvml.running = {0: [(ME, 10), (STRANGER, 20)]}
    listed = watch.listed(0)
    assert listed == {ME: 10, STRANGER: 20, OTHER: None}
    foreign, comparable = watch.foreign(listed, UUIDS[0])
    assert comparable and foreign == {OTHER: None}


def test_in_a_pid_namespace_processes_beyond_the_jobs_count_are_foreign():
    """A container's PIDs differ from the host's that NVML gives: none listed is the job's."""
    steps = [(0.0, {0: [(STRANGER, 10**9)]}), (0.2, {0: [(STRANGER, 10**9), (OTHER, 10**9)]})]
    report = _watched(ProcessNvml(), steps, monitor.JobProcesses(frozenset({ME})))
    rows = _rows(report)
    assert rows.processes.tolist() == [1, 2] and rows.foreign_processes.tolist() == [0, 1]
    assert rows.foreign_mem_mb.isna().all()  # which of them is the job's is not known: no memory
    processes = report["gpus"][0]["processes"]
    assert processes["pid_namespace_samples"] == 2 and processes["expected_own"] == 1
    assert {s["pid"] for s in processes["foreign"]} == {STRANGER, OTHER}
    assert not any(s["identified"] for s in processes["foreign"])


@pytest.mark.parametrize(
    ("nvml", "reason"),
    [
        (FakeNvml(), "nvmlDeviceGetComputeRunningProcesses: not in this nvidia-ml-py"),
        (ProcessNvml(forms=()), "nvmlDeviceGetComputeRunningProcesses_v2: error 13"),
    ],
)
def test_without_a_process_query_the_columns_are_empty_and_the_report_says_why(tmp_path, nvml, reason):
    report = _watched(nvml, [(0.0, {0: [(STRANGER, 1)]}), (0.2, {})])
    rows = _rows(report)
    assert rows[["processes", "foreign_processes", "foreign_mem_mb"]].isna().all().all()  # never 0
    assert rows.power_w.notna().all() and report["process_query"].startswith("not listed: ")
    assert reason in report["process_query"]
    monitor.write_outputs(tmp_path, [report], interval_s=0.1)
    assert reason in json.loads((tmp_path / "gpu_monitor.json").read_text())["processes"]


def test_an_older_driver_falls_back_to_the_v2_query_once():
    nvml = ProcessNvml(forms=("_v2",), running={0: [(ME, 1), (STRANGER, 2_000_000)]})
    report = _watched(nvml, [(0.0, nvml.running), (0.2, nvml.running)])
    assert _rows(report).foreign_processes.tolist() == [1, 1]
    assert report["process_query"] == "NVML nvmlDeviceGetComputeRunningProcesses_v2"
    assert nvml.process_calls == 2  # the forms the driver lacks are not asked again
