"""The NVML sampler: without NVML (this machine), and with a stand-in NVML of two GPUs."""

import json
import time
from types import SimpleNamespace

import pandas as pd
import pytest

from scalestudy import monitor
from scalestudy.monitor import COLUMNS, NodeMonitor


class FakeNvml:
    """The pynvml calls the monitor makes, for two GPUs; GPU 1 does not report PCIe throughput."""

    NVML_PCIE_UTIL_RX_BYTES, NVML_PCIE_UTIL_TX_BYTES, NVML_TEMPERATURE_GPU = 1, 0, 0

    class NVMLError(Exception):
        pass

    def __init__(self):
        self.initialised = False

    def nvmlInit(self):
        self.initialised = True

    def nvmlShutdown(self):
        self.initialised = False

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetUUID(self, handle):
        return f"GPU-{handle}".encode()  # older pynvml returns bytes

    def nvmlDeviceGetName(self, handle):
        return "NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetUtilizationRates(self, handle):
        return SimpleNamespace(gpu=90 + handle, memory=40)

    def nvmlDeviceGetPowerUsage(self, handle):
        return 350_500  # mW

    def nvmlDeviceGetPcieThroughput(self, handle, counter):
        if handle == 1:
            raise self.NVMLError("Not Supported")
        return 12_000 if counter == self.NVML_PCIE_UTIL_RX_BYTES else 3_000  # KB/s

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(used=2_500_000_000, total=80_000_000_000)

    def nvmlDeviceGetTemperature(self, handle, sensor):
        return 61


def test_without_nvml_the_run_folder_says_why(tmp_path):
    node = NodeMonitor(interval_s=0.01, host="cpu-node").start()  # the real pynvml: no driver here
    report = node.stop()
    assert not report["available"] and "NVML" in report["reason"] and report["rows"] == []
    monitor.write_outputs(tmp_path, [report, None], interval_s=0.01)
    assert (tmp_path / "gpu_monitor.csv").read_text() == ",".join(COLUMNS) + "\n"
    summary = json.loads((tmp_path / "gpu_monitor.json").read_text())
    assert summary["available"] is False and "cpu-node" in summary["reason"]


def test_samples_every_gpu_at_the_set_rate_and_converts_units():
    nvml = FakeNvml()
    node = NodeMonitor(interval_s=0.05, t0=time.time(), host="gpu01", nvml=nvml).start()
    time.sleep(0.5)
    report = node.stop()
    assert report["available"] and not nvml.initialised  # shut down after stopping
    assert report["gpus"] == [
        {"index": 0, "uuid": "GPU-0", "name": "NVIDIA H100 80GB HBM3"},
        {"index": 1, "uuid": "GPU-1", "name": "NVIDIA H100 80GB HBM3"},
    ]
    rows = pd.DataFrame(report["rows"], columns=COLUMNS)
    per_gpu = rows.groupby("gpu_index").size()
    assert list(per_gpu.index) == [0, 1] and 5 <= per_gpu[0] <= 12  # ~10 samples in 0.5 s
    first = rows[rows.gpu_index == 0].iloc[0]
    assert (first.sm_util_pct, first.mem_util_pct, first.power_w) == (90, 40, 350.5)
    assert (first.pcie_rx_mb_s, first.pcie_tx_mb_s, first.mem_used_mb, first.temperature_c) == (
        12,
        3,
        2500,
        61,
    )
    assert rows[rows.gpu_index == 1].pcie_rx_mb_s.isna().all()  # unsupported: empty, not an error
    assert rows.time_s.is_monotonic_increasing and 0 <= rows.time_s.iloc[0] < 0.5
    rows_after_stop = len(report["rows"])
    time.sleep(0.15)
    assert len(node.rows) == rows_after_stop


def test_nodes_are_merged_into_one_csv_sorted_by_time(tmp_path):
    reports = []
    for host in ("gpu02", "gpu01"):
        node = NodeMonitor(interval_s=0.05, t0=time.time(), host=host, nvml=FakeNvml()).start()
        time.sleep(0.12)
        reports.append(node.stop())
    monitor.write_outputs(tmp_path, [reports[0], None, reports[1]], interval_s=0.05)
    merged = pd.read_csv(tmp_path / "gpu_monitor.csv")
    assert list(merged.columns) == list(COLUMNS)
    assert set(merged.host) == {"gpu01", "gpu02"}
    assert len(merged) == sum(len(r["rows"]) for r in reports)
    assert merged.time_s.is_monotonic_increasing
    summary = json.loads((tmp_path / "gpu_monitor.json").read_text())
    assert summary["available"] is True and summary["reason"] is None and len(summary["nodes"]) == 2


def test_interval_must_be_positive():
    with pytest.raises(ValueError, match="monitor_interval_s"):
        NodeMonitor(interval_s=0)
