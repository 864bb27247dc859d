"""The contention rule never counts the job's own process tree: with the fake NVML
(tests/fakenvml/pynvml.py) listing, beside the job's rank, the process that spawned it (the
benchmark, the launcher), that one's parent and grandparent, the run is not contended; a sibling
under the same parent (another job of the same Snakemake), a process outside the tree and an unknown
PID still are, with their PIDs in the evidence."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pandas as pd
import pytest

from scalestudy.analysis import contention
from scalestudy.plan.runfiles import MONITOR_COLUMNS as COLUMNS
from scalestudy.train import gpu_processes
from scalestudy.train.gpu_monitor import GpuMonitor
from tests import gpufake

ME = os.getpid()
STRANGER = 9_000_001  # above Linux's pid_max: no /proc entry, never the job's
GB = 10**9


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[1])


def sleeper(*prefix: str) -> subprocess.Popen:
    return subprocess.Popen([*prefix, sys.executable, "-c", "import time; time.sleep(60)"])


@pytest.fixture
def tree():
    """A job's rank spawned by this process (as the benchmark spawns a trainer), a sibling of it,
    and a process outside this tree (setsid -f: reparented, as another job's)."""
    rank, sibling = sleeper(), sleeper()
    outsider = subprocess.Popen(
        ["setsid", "-f", "sh", "-c", "echo $$; exec sleep 60"], stdout=subprocess.PIPE
    )
    outsider_pid = int(outsider.stdout.readline())
    outsider.wait(timeout=30)
    yield {"rank": rank.pid, "sibling": sibling.pid, "outsider": outsider_pid}
    for process in (rank, sibling):
        process.kill()
        process.wait()
    os.kill(outsider_pid, signal.SIGKILL)


def judged(tmp_path, monkeypatch, job_pid: int, listed: list[int]) -> tuple[dict, dict]:
    """The fake NVML's one GPU lists `listed` (1 GB each) in three samples of the job's monitor."""
    state = gpufake.write_state(tmp_path / "nvml.json", 1)
    machine = json.loads(state.read_text())
    machine["gpus"][0]["processes"] = [{"pid": pid, "used_memory": GB} for pid in listed]
    state.write_text(json.dumps(machine))
    monkeypatch.setenv(gpufake.STATE_ENV, str(state))
    job = gpu_processes.JobProcesses(frozenset({job_pid}))
    node = GpuMonitor(0.1, t0=0.0, host="gpu01", nvml=gpufake.fake_nvml(), job=job)
    assert node.open(), node.reason
    for now in (0.0, 0.1, 0.2):
        node.sample(now)
    report = node.stop()
    rows = pd.DataFrame(report["rows"], columns=COLUMNS)
    info = {"nodes": [{"host": report["host"], "gpus": report["gpus"], "cpus": report["cpus"]}]}
    return contention.judge(rows, info, None), report


def test_the_process_that_spawned_the_job_and_its_ancestors_are_the_jobs_own(tmp_path, monkeypatch, tree):
    parent, grandparent = os.getppid(), parent_of(os.getppid())
    assert parent_of(tree["rank"]) == ME and grandparent >= 1
    # the benchmark (this process) with its CUDA context, and its launcher's processes above it
    verdict, report = judged(tmp_path, monkeypatch, tree["rank"], [tree["rank"], ME, parent, grandparent])
    assert verdict["contention_checked"] and not verdict["contended"], verdict
    assert report["gpus"][0]["processes"]["foreign"] == []
    assert report["gpus"][0]["processes"]["pid_namespace_samples"] == 0


@pytest.mark.parametrize("who", ["sibling", "outsider", "stranger"])
def test_a_process_outside_the_jobs_tree_is_still_foreign(tmp_path, monkeypatch, tree, who):
    other = {**tree, "stranger": STRANGER}[who]
    verdict, _ = judged(tmp_path, monkeypatch, tree["rank"], [tree["rank"], ME, os.getppid(), other])
    assert verdict["contended"], verdict
    assert f"1 foreign process (pids {other}; 1000 MB) in 3 of 3" in verdict["contention"], verdict


def test_the_ancestors_are_read_once_from_proc(tmp_path):
    """A made-up /proc: rank 40's parent 30, its parent 20, init; 50 is 30's other child."""
    for pid, ppid in {40: 30, 30: 20, 20: 1, 1: 0, 50: 30}.items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(f"{pid} (python3 (x)) S {ppid} {pid} {pid} 0\n")
    watch = gpu_processes.Processes(None, gpu_processes.JobProcesses(frozenset({40})), tmp_path)
    assert watch.ancestors() == {30, 20, 1}
    foreign, comparable = watch.foreign({40: GB, 30: GB, 20: GB, 50: GB, STRANGER: None}, "GPU-a")
    assert comparable and foreign == {50: GB, STRANGER: None}
    (tmp_path / "30" / "stat").unlink()  # read once: a later change of /proc does not matter
    assert watch.ancestors() == {30, 20, 1}
    # none listed is the job's or its ancestor: PIDs of another namespace, not comparable
    assert watch.foreign({STRANGER: GB}, "GPU-a") == ({STRANGER: GB}, False)
