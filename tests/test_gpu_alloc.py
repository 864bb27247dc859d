"""GPUs as a job's own on one machine (scalestudy.launch.gpus and the launcher): which GPUs the
machine offers, N of them held by a lock per GPU (all or nothing, waiting while busy), released
when the job's processes end however they end, and what the ranks and their provenance get.

Against the fake NVML (tests/fakenvml/pynvml.py) of 2 and of 8 GPUs, with real processes: the
launcher, torchrun, and a probe rank that records what it was given. No GPU needed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scalestudy import provenance
from scalestudy.launch import gpus
from scalestudy.launch import launcher as launch
from scalestudy.plan import cluster
from tests import gpufake
from tests.conftest import REPO

PROBE = '''"""A rank that records the GPUs its launcher gave it: a line when it starts, one when it ends."""
import json, os, sys, time

NAMES = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "SCALESTUDY_GPU_UUIDS", "SCALESTUDY_GPU_SOURCE")


def record(event):
    line = {"event": event, "time": time.time(), "pid": os.getpid(), "job": sys.argv[2],
            "rank": os.environ.get("LOCAL_RANK", "0"),
            **{name: os.environ.get(name) for name in NAMES}}
    with open(sys.argv[1], "a") as handle:
        handle.write(json.dumps(line) + "\\n")

def started():
    with open(sys.argv[1]) as handle:
        return sum(json.loads(line)["event"] == "start" for line in handle)

record("start")
if sys.argv[3].startswith("until:"):  # a barrier: wait until that many ranks have started (90 s at most)
    deadline = time.monotonic() + 90
    while started() < int(sys.argv[3][len("until:"):]):
        if time.monotonic() > deadline:
            sys.exit(3)
        time.sleep(0.05)
else:
    time.sleep(float(sys.argv[3]))
record("end")
'''


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """A fake machine: (environment for child processes, the record file); 2 GPUs unless changed."""
    (tmp_path / "probe").mkdir()
    (tmp_path / "probe" / "gpuprobe.py").write_text(PROBE)
    state = gpufake.write_state(tmp_path / "nvml.json", 2)
    env = gpufake.machine_env(state, tmp_path / "locks")
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(REPO), str(tmp_path / "probe")])
    for name in (gpufake.STATE_ENV, gpufake.LOCK_DIR_ENV):
        monkeypatch.setenv(name, env[name])  # for the in-process calls too
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return env, tmp_path / "records.jsonl"


def gpu_spec(world: int, device: str = "cuda") -> dict:
    return {"world_size": world, "gpus_per_node": world, "device": device, "launcher": "local"}


def start(env: dict, record: Path, job: str, spec: dict, seconds: float | str = 0.0) -> subprocess.Popen:
    """The launcher starting probe ranks that run `seconds` (or "until:N": until N ranks started)."""
    argv = [sys.executable, "-m", "scalestudy.launch", "--launch-json", json.dumps(spec)]
    argv += ["--module", "gpuprobe", "--", str(record), job, str(seconds)]
    return subprocess.Popen(
        argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def finish(process: subprocess.Popen, timeout: float = 60) -> str:
    _, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, err
    return err


def records(record: Path) -> list[dict]:
    return [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []


def wait_for(condition, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def intervals(record: Path) -> dict[str, dict]:
    """Per job: its GPUs (NVML indices and UUIDs as the ranks saw them) and its start and end."""
    jobs: dict[str, dict] = {}
    for line in records(record):
        job = jobs.setdefault(line["job"], {"start": line["time"], "end": line["time"], "lines": []})
        job["start"], job["end"] = min(job["start"], line["time"]), max(job["end"], line["time"])
        job["lines"].append(line)
    for job in jobs.values():
        first = job["lines"][0]
        job["indices"] = set(first["CUDA_VISIBLE_DEVICES"].split(","))
        job["uuids"] = first["SCALESTUDY_GPU_UUIDS"].split(",")
        assert all(line["SCALESTUDY_GPU_UUIDS"] == first["SCALESTUDY_GPU_UUIDS"] for line in job["lines"])
    return jobs


def overlap(a: dict, b: dict) -> bool:
    return a["start"] < b["end"] and b["start"] < a["end"]


# --------------------------------------------------------------------------- the fake NVML


def test_the_fake_nvml_has_pynvmls_constants_and_error_and_lists_its_state(tmp_path, monkeypatch):
    import pynvml as real  # the venv's nvidia-ml-py: this process does not have the fake first

    fake = gpufake.fake_nvml()
    constants = [name for name in vars(fake) if name.startswith("NVML_")]
    assert len(constants) > 10
    assert {name: getattr(real, name) for name in constants} == {name: vars(fake)[name] for name in constants}
    monkeypatch.delenv(gpufake.STATE_ENV, raising=False)
    with pytest.raises(fake.NVMLError) as missing:
        fake.nvmlInit()
    assert missing.value.value == real.NVML_ERROR_LIBRARY_NOT_FOUND
    state = gpufake.write_state(tmp_path / "nvml.json", 2)
    monkeypatch.setenv(gpufake.STATE_ENV, str(state))
    with pytest.raises(fake.NVMLError):
        fake.nvmlDeviceGetCount()  # before nvmlInit, as NVML
    fake.nvmlInit()
    handle = fake.nvmlDeviceGetHandleByIndex(1)
    assert fake.nvmlDeviceGetUUID(handle) == gpufake.uuids(2)[1] and fake.nvmlDeviceGetCount() == 2
    with pytest.raises(fake.NVMLError) as unsupported:
        fake.nvmlDeviceGetPowerUsage(handle)  # not simulated: NVML's "Not Supported"
    assert unsupported.value.value == real.NVML_ERROR_NOT_SUPPORTED
    data = json.loads(state.read_text())
    data["gpus"][1]["processes"] = [{"pid": 4242, "used_memory": 3_100_000_000}]
    state.write_text(json.dumps(data))  # the state file is re-read: a process appears mid-run
    (process,) = fake.nvmlDeviceGetComputeRunningProcesses(handle)
    assert (process.pid, process.usedGpuMemory) == (4242, 3_100_000_000)
    assert fake.nvmlDeviceGetMemoryInfo(handle).used == 3_100_000_000
    fake.nvmlShutdown()


# --------------------------------------------------------------------------- what the machine offers


def test_the_machine_offers_nvmls_gpus_within_cuda_visible_devices(tmp_path, monkeypatch):
    monkeypatch.setenv(gpufake.STATE_ENV, str(gpufake.write_state(tmp_path / "nvml.json", 8)))
    fake, names = gpufake.fake_nvml(), gpufake.uuids(8)

    def indices(visible: str | None) -> list[int]:
        environ = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
        return [gpu.index for gpu in gpus.offered(environ, fake).gpus]

    assert indices(None) == list(range(8))
    assert indices("6,2") == [6, 2]
    assert indices(f"{names[5]},{names[3][:12]}") == [5, 3]  # UUIDs, or a unique prefix, as CUDA
    assert indices("1,-1,2") == [1]  # as CUDA: an entry naming no GPU ends the list
    assert indices("") == [] and indices("MIG-1234") == []
    offer = gpus.offered({"CUDA_VISIBLE_DEVICES": "0,1"}, fake)
    assert offer.note == "NVML: 8 GPU(s); CUDA_VISIBLE_DEVICES='0,1' leaves 2"
    assert [gpu.uuid for gpu in offer.gpus] == names[:2]
    monkeypatch.delenv(gpufake.STATE_ENV)
    none = gpus.offered({}, fake)
    assert none.gpus == () and "NVML unavailable" in none.note
    monkeypatch.setenv(
        gpufake.STATE_ENV, str(gpufake.write_state(tmp_path / "nodriver.json", 2, driver_loaded=False))
    )
    assert gpus.offered({}, fake).gpus == ()


# --------------------------------------------------------------------------- the locks


def test_the_lock_folder_is_shared_like_tmp_and_its_files_by_every_user(tmp_path):
    old_umask = os.umask(0o077)
    try:
        folder = gpus.lock_folder({gpus.LOCK_DIR_ENV: str(tmp_path / "locks")})
        held, _ = gpus.try_acquire([gpus.Gpu(0, gpufake.uuids(1)[0])], 1, folder)
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o1777
    lock = folder / f"{gpufake.uuids(1)[0]}.lock"
    assert stat.S_IMODE(lock.stat().st_mode) == 0o666
    assert json.loads(lock.read_text())["pid"] == os.getpid()
    held.release()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(gpus.GpuError, match="is not a folder"):
        gpus.lock_folder({gpus.LOCK_DIR_ENV: str(tmp_path / "link")})


def test_gpus_are_taken_all_or_nothing_and_a_waiting_job_holds_none(tmp_path):
    folder = gpus.lock_folder({gpus.LOCK_DIR_ENV: str(tmp_path / "locks")})
    two = [gpus.Gpu(index, uuid) for index, uuid in enumerate(gpufake.uuids(2))]
    first, _ = gpus.try_acquire(two, 1, folder, label="job one")
    assert first.gpus == (two[0],)
    assert all(os.get_inheritable(fd) for fd in first.fds)  # they survive the launcher's exec
    nothing, busy = gpus.try_acquire(two, 2, folder)
    assert nothing is None and busy == [two[0]]
    second, _ = gpus.try_acquire(two, 1, folder)  # the pair's attempt kept nothing: GPU 1 is free
    assert second.gpus == (two[1],)
    second.release()
    first.release()
    both, _ = gpus.try_acquire(two, 2, folder)
    assert both.gpus == tuple(two)
    both.release()


def test_a_job_waits_for_all_its_gpus_saying_which_are_busy_and_by_whom(tmp_path):
    folder = gpus.lock_folder({gpus.LOCK_DIR_ENV: str(tmp_path / "locks")})
    two = [gpus.Gpu(index, uuid) for index, uuid in enumerate(gpufake.uuids(2))]
    other, _ = gpus.try_acquire(two[1:], 1, folder, label="results/logs/scaling/strong/w1_r0.log")
    said, clock = [], [0.0]

    def sleep(seconds):  # another job ends after 95 s of waiting
        clock[0] += seconds
        if clock[0] >= 95:
            other.release()

    held = gpus.acquire(
        two, 2, folder, poll_s=5, progress_every_s=30, say=said.append, clock=lambda: clock[0], sleep=sleep
    )
    assert held.gpus == tuple(two)
    held.release()
    waiting = [line for line in said if line.startswith("waiting")]
    assert [line.split(" s so far")[0] for line in waiting] == [
        "waiting 0",
        "waiting 30",
        "waiting 60",
        "waiting 90",
    ]
    assert f"busy: {two[1]} held by pid {os.getpid()}" in waiting[0]
    assert "results/logs/scaling/strong/w1_r0.log" in waiting[0] and "GPU-00000000" not in waiting[0]
    assert said[-1].startswith(f"got {two[0]}, {two[1]} after waiting 95 s")


# --------------------------------------------------------------------------- a launch's GPUs


def test_a_cpu_job_takes_no_gpu_and_hides_them_outside_slurm(machine):
    cpu = check(world_size=2, gpus_per_node=0)
    assert gpus.assign(cpu, "local", {}).env() == {
        "SCALESTUDY_GPU_SOURCE": "none",
        "SCALESTUDY_GPU_UUIDS": "",
        "CUDA_VISIBLE_DEVICES": "",
    }
    assert gpus.assign(check(**gpu_spec(1, device="cpu")), "local", {}).env()["CUDA_VISIBLE_DEVICES"] == ""
    in_slurm = gpus.assign(cpu, "srun", {"SLURM_JOB_ID": "7"}).env()
    assert in_slurm == {"SCALESTUDY_GPU_SOURCE": "none", "SCALESTUDY_GPU_UUIDS": ""}


def test_inside_slurm_the_gpus_are_slurms_and_no_lock_is_taken(machine):
    env, _ = machine
    folder = gpus.lock_folder(env)
    every = [gpus.Gpu(index, uuid) for index, uuid in enumerate(gpufake.uuids(2))]
    holder, _ = gpus.try_acquire(every, 2, folder)  # another job holds every GPU here
    try:
        for launcher in ("srun", "local"):
            assigned = gpus.assign(check(**gpu_spec(2)), launcher, {"SLURM_JOB_ID": "7"})
            assert assigned.env() == {"SCALESTUDY_GPU_SOURCE": "slurm", "SCALESTUDY_GPU_UUIDS": ""}
    finally:
        holder.release()


def test_device_auto_runs_on_the_cpu_without_gpus_and_cuda_stops_naming_both_numbers(machine, monkeypatch):
    monkeypatch.delenv(gpufake.STATE_ENV)  # no NVML on this machine
    said = []
    auto = gpus.assign(
        check(**gpu_spec(2, device="auto")), "local", {}, nvml=gpufake.fake_nvml(), say=said.append
    )
    assert auto.source == "none" and auto.env()["CUDA_VISIBLE_DEVICES"] == ""
    assert "no GPU on this machine" in said[0] and "the ranks run on the CPU" in said[0]
    with pytest.raises(
        gpus.GpuError, match=r"this job's 1 rank\(s\) need 1 GPU\(s\), one each, but this machine offers 0"
    ):
        gpus.assign(check(**gpu_spec(1)), "local", {}, nvml=gpufake.fake_nvml())


def check(**spec) -> dict:
    return launch.check_spec(spec)


def test_the_launch_spec_says_how_many_gpus_the_ranks_use():
    gpu = {"cluster": {"gpus_per_node": 4}, "train": {"device": "cuda"}}
    spec = cluster.launch_spec(gpu, 8)
    assert (spec["gpus_per_node"], spec["device"], spec["gres"]) == (4, "cuda", "gpu:4")
    assert gpus.gpus_needed(launch.check_spec(cluster.launch_spec(gpu, 2))) == 2
    auto = cluster.launch_spec({"cluster": {"gpus_per_node": 4}}, 2)  # train.device's default: auto
    assert auto["device"] == "auto" and auto["gpus_per_node"] == 2
    # CPU ranks: no GPU taken and the spec without `device` (the demo's JSON stays as it was)
    cpu_device = cluster.launch_spec({"cluster": {"gpus_per_node": 4}, "train": {"device": "cpu"}}, 2)
    assert cpu_device["gpus_per_node"] == 0 and "device" not in cpu_device and cpu_device["gres"] == "gpu:2"
    cpu_nodes = cluster.launch_spec({"cluster": {"gpus_per_node": 0, "ranks_per_node": 2}}, 2)
    assert cpu_nodes["gpus_per_node"] == 0 and "device" not in cpu_nodes
    with pytest.raises(launch.LaunchError, match="device must be one of auto, cuda, cpu"):
        launch.check_spec({**spec, "device": "gpu"})


def test_provenance_records_the_jobs_gpus_and_who_gave_them(monkeypatch):
    monkeypatch.setenv("SCALESTUDY_GPU_SOURCE", "local-lock")
    monkeypatch.setenv("SCALESTUDY_GPU_UUIDS", ",".join(gpufake.uuids(2)))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    record = provenance.flatten(provenance.collect(), "provenance.")
    assert record["provenance.gpus.source"] == "local-lock"
    assert json.loads(record["provenance.gpus.uuids"]) == gpufake.uuids(2)
    assert record["provenance.gpus.cuda_visible_devices"] == "0,1"
    monkeypatch.delenv("SCALESTUDY_GPU_UUIDS")
    assert provenance.collect()["gpus"]["uuids"] is None  # not started by the launcher: unknown


# --------------------------------------------------------------------------- the launcher, for real


def test_two_one_gpu_jobs_run_at_once_on_disjoint_gpus_and_a_two_gpu_job_waits_for_both(machine):
    env, record = machine
    first = start(env, record, "one-a", gpu_spec(1), seconds=3)
    second = start(env, record, "one-b", gpu_spec(1), seconds=3)
    wait_for(lambda: len(records(record)) == 2)  # both started
    pair = start(env, record, "two", gpu_spec(2))
    for process in (first, second):
        finish(process)
    waited = finish(pair)
    jobs, names = intervals(record), gpufake.uuids(2)
    assert overlap(jobs["one-a"], jobs["one-b"])
    assert {frozenset(jobs["one-a"]["indices"]), frozenset(jobs["one-b"]["indices"])} == {
        frozenset("0"),
        frozenset("1"),
    }
    for job in ("one-a", "one-b"):
        (index,) = jobs[job]["indices"]
        assert jobs[job]["uuids"] == [names[int(index)]]  # the UUID is that GPU's, in NVML's order
        assert jobs[job]["lines"][0]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        assert jobs[job]["lines"][0]["SCALESTUDY_GPU_SOURCE"] == "local-lock"
        assert not overlap(jobs[job], jobs["two"])
    assert jobs["two"]["indices"] == {"0", "1"} and jobs["two"]["uuids"] == names
    assert "waiting 0 s so far for 2 free GPU(s) of 2; busy: GPU-" in waited


def test_on_eight_gpus_jobs_of_one_two_and_four_run_side_by_side_on_disjoint_gpus(machine):
    env, record = machine
    gpufake.write_state(Path(env[gpufake.STATE_ENV]), 8)
    # every rank runs until all 7 have started: only jobs that hold their GPUs side by side finish
    launched = {f"w{n}": start(env, record, f"w{n}", gpu_spec(n), seconds="until:7") for n in (1, 2, 4)}
    for process in launched.values():
        finish(process, timeout=120)
    jobs = intervals(record)
    assert len([line for line in records(record) if line["event"] == "start"]) == 7
    assert (
        overlap(jobs["w1"], jobs["w2"])
        and overlap(jobs["w2"], jobs["w4"])
        and overlap(jobs["w1"], jobs["w4"])
    )
    given = [jobs[name]["indices"] for name in ("w1", "w2", "w4")]
    assert [len(indices) for indices in given] == [1, 2, 4]
    assert len(set.union(*given)) == 7  # disjoint
    for job in jobs.values():  # every rank of a job sees the same GPUs
        assert {line["CUDA_VISIBLE_DEVICES"] for line in job["lines"]} == {
            ",".join(sorted(job["indices"], key=int))
        }


@pytest.mark.parametrize("world", [1, 2])
def test_a_killed_jobs_gpus_are_free_again(machine, world):
    """SIGKILL to the launcher's process (exec'd into the rank, or into torchrun's agent): the
    kernel closes its lock descriptors; no cleanup code runs and none is needed."""
    env, record = machine
    job = start(env, record, "killed", gpu_spec(world), seconds=60)
    wait_for(lambda: len(records(record)) == world, seconds=60)
    every = [gpus.Gpu(index, uuid) for index, uuid in enumerate(gpufake.uuids(2))]
    folder = gpus.lock_folder(env)
    held, busy = gpus.try_acquire(every, 2, folder)
    assert held is None and len(busy) == world  # held while the job runs
    job.send_signal(signal.SIGKILL)
    job.wait()
    held, busy = gpus.try_acquire(every, 2, folder)
    assert held is not None, busy
    held.release()
    for line in records(record):  # torchrun's ranks outlive a SIGKILLed probe agent; end them
        with contextlib.suppress(ProcessLookupError):
            os.kill(line["pid"], signal.SIGKILL)


def test_more_gpus_than_the_machine_has_fail_at_once_naming_both_numbers(machine):
    env, record = machine
    job = start(env, record, "too-big", gpu_spec(4))
    _, err = job.communicate(timeout=60)
    assert job.returncode == 2
    assert "launch: error: this job's 4 rank(s) need 4 GPU(s), one each, but this machine offers 2" in err
    assert not record.exists()  # nothing started


def test_a_dry_run_takes_no_gpu(machine):
    env, _ = machine
    argv = ["--dry-run", "--launch-json", json.dumps(gpu_spec(2)), "--module", "gpuprobe", "--", "x"]
    _, environment, dry = launch.prepare(argv, {**env, "PATH": os.environ["PATH"]})
    assert dry and gpus.SOURCE_ENV not in environment
    assert not Path(env[gpufake.LOCK_DIR_ENV]).exists()  # not even the lock folder


def test_a_rank_prefix_runs_inside_the_jobs_gpus(machine):
    """Profile runs put nsys or ncu before each rank (the launcher's --rank-prefix-json): the prefix
    is what the launcher execs, so it holds the locks, and the rank after it sees the GPUs."""
    env, record = machine
    argv = [sys.executable, "-m", "scalestudy.launch", "--launch-json", json.dumps(gpu_spec(1))]
    argv += ["--rank-prefix-json", json.dumps(["env", "PROFILER=on"]), "--module", "gpuprobe"]
    job = subprocess.Popen([*argv, "--", str(record), "prefixed", "until:2"], cwd=REPO, env=env, text=True)
    try:
        wait_for(lambda: records(record))
        every = [gpus.Gpu(index, uuid) for index, uuid in enumerate(gpufake.uuids(2))]
        held, busy = gpus.try_acquire(every, 2, gpus.lock_folder(env))
        assert held is None and busy == [every[0]]
    finally:
        job.kill()
        job.wait()
    (line,) = records(record)
    assert (line["CUDA_VISIBLE_DEVICES"], line["SCALESTUDY_GPU_SOURCE"]) == ("0", "local-lock")


def test_every_path_that_starts_gpu_ranks_goes_through_the_launcher():
    """Training (rules), profile and ncu runs (profiling.run.launch_argv), the smoke step and the site
    check (preflight.common.launch_argv), the collective benchmark (rules/comm.smk): the launcher,
    not a dry run, is what starts their ranks."""
    from scalestudy.preflight import common
    from scalestudy.profiling import run as profile_run

    spec = cluster.launch_spec({"cluster": {"gpus_per_node": 2}, "train": {"device": "cuda"}}, 2)
    started = [
        profile_run.launch_argv(spec, {"world_size": 2}, "out", ["nsys", "profile"]),
        common.launch_argv(spec, ["--run-config-json", "{}"]),
        common.launch_argv(spec, ["rank"], module="scalestudy.preflight.site"),
    ]
    for argv in started:
        assert argv[:3] == [sys.executable, "-m", "scalestudy.launch"] and "--dry-run" not in argv
    rules = {path.name: path.read_text() for path in (REPO / "rules").glob("*.smk")}
    for rule_file in ("baseline.smk", "comm.smk", "smoke.smk"):
        assert '"python -m scalestudy.launch --launch-json {params.launch:q}' in rules[rule_file]
    assert "python -m scalestudy.profiling.run --launch-json" in rules["profile.smk"]
    assert "python -m scalestudy.profiling.ncu run --launch-json" in rules["profile.smk"]
