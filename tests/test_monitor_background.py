"""The GPU monitor opened off the trainer's critical path (issue 41): start(background=True) returns
at once and opens NVML on the monitor's thread while the trainer loads its data and model;
wait_open() returns once it samples (or has found no GPU), so sampling has begun before the first
step, hence before the measurement window. Against the stand-in NVML of tests/monitor_helpers.py."""

from __future__ import annotations

import threading
import time

import torch

from scalestudy.train import gpu_monitor as monitor
from scalestudy.train.gpu_monitor import GpuMonitor
from tests.monitor_helpers import UUIDS, FakeNvml

SLOW_S = 0.4  # a slow nvmlInit (a driver not in persistence mode takes seconds)


class SlowNvml(FakeNvml):
    def __init__(self, fail: Exception | None = None):
        super().__init__()
        self.fail = fail
        self.release = threading.Event()

    def nvmlInit(self):
        self.release.wait(SLOW_S)
        if self.fail is not None:
            raise self.fail
        super().nvmlInit()


def _monitor(nvml) -> GpuMonitor:
    return GpuMonitor(interval_s=0.05, t0=time.time(), host="gpu01", gpu_uuids=[UUIDS[0]], nvml=nvml)


def test_a_background_start_returns_at_once_and_samples_before_wait_open_returns():
    nvml = SlowNvml()
    node = _monitor(nvml)
    began = time.perf_counter()
    node.start(background=True)
    assert time.perf_counter() - began < SLOW_S / 2  # NVML opens on the monitor's thread
    assert not node.wait_open(0.0) and node.rows == []  # still opening
    assert node.wait_open(10)
    opened = time.perf_counter() - began
    assert opened >= SLOW_S * 0.9 and len(node.rows) >= 1  # sampling has begun
    report = node.stop()
    assert report["available"] and report["reason"] is None and not nvml.initialised


def test_a_foreground_start_has_sampled_or_opened_when_it_returns():
    nvml = FakeNvml()
    node = _monitor(nvml).start()
    assert node.wait_open(10) and node.rows
    assert node.stop()["available"]


def test_no_nvml_in_the_background_is_reported_and_wait_open_returns():
    nvml = SlowNvml(fail=RuntimeError("libnvidia-ml.so.1: cannot open shared object file"))
    node = _monitor(nvml).start(background=True)
    assert node.wait_open(10)
    report = node.stop()
    assert not report["available"] and report["rows"] == []
    assert report["reason"] == (
        "NVML unavailable on gpu01: RuntimeError: libnvidia-ml.so.1: cannot open shared object file"
    )


def test_an_unexpected_error_while_opening_leaves_the_run_going_and_says_why(monkeypatch):
    def broken(self):
        raise KeyError("surprise")

    monkeypatch.setattr(GpuMonitor, "_open_devices", broken)
    node = _monitor(FakeNvml()).start(background=True)
    assert node.wait_open(10)
    report = node.stop()
    assert not report["available"] and report["rows"] == []
    assert report["reason"] == "GPU monitor failed to start on gpu01: KeyError: 'surprise'"


def test_stopping_while_nvml_still_opens_waits_for_it_and_releases_it():
    nvml = SlowNvml()
    node = _monitor(nvml).start(background=True)
    report = node.stop()  # joins the opening thread: NVML opened, then shut down
    assert report["available"] and not nvml.initialised
    assert len(report["rows"]) == 1  # only the run's-end sample: it never sampled on its own
    assert node.wait_open(0.0)


def test_a_cpu_rank_in_the_background_says_why_at_once():
    node = monitor.for_device(torch.device("cpu"), 0.1).start(background=True)
    assert node.wait_open(5)
    report = node.stop()
    assert report["reason"] == "no NVIDIA GPU (device cpu)" and report["rows"] == []
