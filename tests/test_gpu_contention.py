"""Contention on a real GPU and driver, skipped elsewhere (saying so): NVML lists this process on its
GPU as the job's own, a child of it holding memory there as the job's too, the parent of a job (as
the benchmark is of its trainers) as the job's, and a process outside its tree (another job) as
foreign, with its PID and memory; the analysis marks the window contended.
Run where there is a GPU (with the other GPU tests); the CPU tests use a fake NVML
(tests/test_monitor_processes.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest
import torch

from scalestudy.analysis import contention
from scalestudy.plan.runfiles import MONITOR_COLUMNS
from scalestudy.train import gpu_monitor as monitor

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU and its NVML")

# holds 512 MiB on the GPU, says its pid, sleeps
HOLDER = """
import os, sys, time, torch
block = torch.empty(512 * 2**20, dtype=torch.uint8, device="cuda")
print(os.getpid(), flush=True)
time.sleep(60)
"""


def _sampled(seconds: float, job_pid: int | None = None) -> tuple[pd.DataFrame, dict]:
    """Samples of this process's GPU, the job being this process (or `job_pid`, one of its children)."""
    device = torch.device("cuda", torch.cuda.current_device())
    torch.empty(1, device=device)  # this process's CUDA context: what NVML lists as the job's
    job = monitor.JobProcesses(frozenset({job_pid or os.getpid()}))
    node = monitor.for_device(device, 0.1, t0=time.time(), job=job)
    assert node.open(), node.reason
    for _ in range(int(seconds / 0.1)):
        node.sample()
        time.sleep(0.1)
    report = node.stop()
    return pd.DataFrame(report["rows"], columns=MONITOR_COLUMNS), report


def _holder(*prefix: str) -> tuple[subprocess.Popen, int]:
    """A process holding GPU memory (its pid); `setsid -f` puts it outside this process's tree."""
    device = str(torch.cuda.current_device())
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", device)}
    process = subprocess.Popen(
        [*prefix, sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True, env=env
    )
    return process, int(process.stdout.readline())


def _stop(process: subprocess.Popen, pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    process.wait(timeout=30)


def test_the_jobs_processes_are_its_own_and_another_jobs_is_foreign():
    rows, report = _sampled(0.5)
    assert rows["processes"].notna().all(), f"this NVML lists no processes: {report['process_query']}"
    assert (rows["processes"] >= 1).all() and (rows["foreign_processes"] == 0).all(), rows
    child, child_pid = _holder()
    try:
        rows, report = _sampled(1.0)
    finally:
        _stop(child, child_pid)
    if report["gpus"][0]["processes"]["pid_namespace_samples"]:
        pytest.skip("NVML's PIDs are of another PID namespace here (a container): counted, not identified")
    assert (rows["processes"] >= 2).all() and (rows["foreign_processes"] == 0).all(), rows  # a child: own
    outsider, outsider_pid = _holder("setsid", "-f")
    try:
        rows, report = _sampled(1.0)
    finally:
        _stop(outsider, outsider_pid)
    assert (rows["foreign_processes"] >= 1).all(), rows
    assert outsider_pid in {span["pid"] for span in report["gpus"][0]["processes"]["foreign"]}
    memory = rows["foreign_mem_mb"].dropna()
    assert memory.empty or memory.min() >= 500, rows  # 512 MiB; None where the driver does not say
    info = {"nodes": [{"host": report["host"], "gpus": report["gpus"], "cpus": report["cpus"]}]}
    verdict = contention.judge(rows, info, None)
    assert verdict["contended"] and verdict["contention_checked"], verdict
    assert f"pids {outsider_pid}" in verdict["contention"], verdict


def test_the_process_that_spawned_the_job_is_its_own():
    """As the benchmark spawns a trainer (issue 41): this process holds a CUDA context, the job is a
    child of it holding memory on the GPU; the parent is the job's tree, not a foreign process."""
    child, child_pid = _holder()
    try:
        rows, report = _sampled(1.0, job_pid=child_pid)
    finally:
        _stop(child, child_pid)
    if report["gpus"][0]["processes"]["pid_namespace_samples"]:
        pytest.skip("NVML's PIDs are of another PID namespace here (a container): counted, not identified")
    assert (rows["processes"] >= 2).all() and (rows["foreign_processes"] == 0).all(), rows
