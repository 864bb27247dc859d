"""What else runs on the job's GPU (scalestudy.train.gpu_processes) as the NVML monitor counts it,
against the stand-in NVML of tests/monitor_helpers.py given NVML's process queries: the job's own
processes (its ranks and their children), foreign ones with their memory, the MPS server and its
clients, a PID namespace, an older driver's query, and no process query at all."""

import json
import os
import signal
import subprocess
import sys
from types import SimpleNamespace

import pytest

from scalestudy.train import gpu_monitor as monitor
from scalestudy.train import gpu_monitor_files, gpu_processes
from scalestudy.train.gpu_monitor import GpuMonitor
from tests.monitor_helpers import UUIDS, FakeNvml, rows_of


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
    rows = rows_of(report)
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
        job = gpu_processes.job_on_host(ranks, "gpu01")
        assert job.pids == {ME, STRANGER + 5} and job.expected_on(UUIDS[0]) == 1
        running = {0: [(ME, 10), (STRANGER + 5, 10), (child.pid, 10), (OTHER, 10), (outsider_pid, 10)]}
        report = _watched(ProcessNvml(), [(0.0, running)], job)
        rows = rows_of(report)
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
    rows = rows_of(report)
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
    rows = rows_of(report)
    assert rows[["processes", "foreign_processes", "foreign_mem_mb"]].isna().all().all()  # never 0
    assert rows.power_w.notna().all() and report["process_query"].startswith("not listed: ")
    assert reason in report["process_query"]
    gpu_monitor_files.write_outputs(tmp_path, [report], interval_s=0.1)
    assert reason in json.loads((tmp_path / "gpu_monitor.json").read_text())["processes"]


def test_an_older_driver_falls_back_to_the_v2_query_once():
    nvml = ProcessNvml(forms=("_v2",), running={0: [(ME, 1), (STRANGER, 2_000_000)]})
    report = _watched(nvml, [(0.0, nvml.running), (0.2, nvml.running)])
    assert rows_of(report).foreign_processes.tolist() == [1, 1]
    assert report["process_query"] == "NVML nvmlDeviceGetComputeRunningProcesses_v2"
    assert nvml.process_calls == 2  # the forms the driver lacks are not asked again
