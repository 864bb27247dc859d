"""GPUs as a scheduled resource of Snakemake's local executor (rules/common/resources.smk, docs/guide/gpu.md),
on a fake machine of 2 or 8 GPUs (tests/fakenvml/pynvml.py first on every process's PYTHONPATH).

Dry runs: every job whose ranks use GPUs declares `gpu` (its ranks) under profiles/local, the
workflow registers the machine's count (or takes `--resources gpu=N`), a CPU study declares none.
Real runs (the command workload with a probe script, so no CUDA is needed): two 1-GPU training
points at once on disjoint GPUs, and a second Snakemake on the same machine waiting for a GPU the
first one's job holds. The Slurm profile's dry run (no `gpu` resource): tests/test_slurm_dryrun.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests import gpufake
from tests.conftest import REPO, copy_workflow, parse_jobs, snakemake_env

pytestmark = pytest.mark.slow

# rule -> the GPUs its job's ranks use, from its wildcards and the config below
GPU_RULES = {
    "baseline_run": lambda wc, c: 1,
    "scaling_run": lambda wc, c: int(wc["point"].split("/w")[1].split("_")[0]),
    "sensitivity_run": lambda wc, c: c["sensitivity"]["world_size"],
    "profile_run": lambda wc, c: int(wc["world"]),
    "profile_ncu": lambda wc, c: 1,
    "smoke_io": lambda wc, c: 1,
    "smoke_step": lambda wc, c: int(wc["world"]),
    "comm_bench": lambda wc, c: int(wc["world"]),
    "site_check": lambda wc, c: 2,
}


def gpu_config(worlds: list[int], gpus_per_node: int) -> dict:
    """The demo study on GPUs: cuda + nccl, these world sizes everywhere, ncu on."""
    config = yaml.safe_load((REPO / "config/demo.yaml").read_text())
    config["train"].update(device="cuda", backend="nccl")
    config["cluster"].update(gpus_per_node=gpus_per_node, ranks_per_node=None)
    config["scaling"]["world_sizes"] = worlds
    config["sensitivity"]["world_size"] = worlds[-1]
    config["profiling"].update(world_sizes=worlds, ncu={"enabled": True})
    return config


def snakemake(workdir: Path, env: dict, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "snakemake", "--profile", "profiles/local", *args]
    return subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout)


def dry_run(tmp_path: Path, config: dict | None, gpus: int, *args: str) -> tuple[list[dict], str]:
    """(job blocks, output) of `snakemake -n --profile profiles/local` on a machine of `gpus` GPUs."""
    workdir = copy_workflow(tmp_path / "workflow")
    if config is not None:
        (workdir / "config/gpu.yaml").write_text(yaml.safe_dump(config))
        args = (*args, "--configfile", "config/gpu.yaml")
    env = gpufake.machine_env(
        gpufake.write_state(tmp_path / "nvml.json", gpus), tmp_path / "locks", snakemake_env()
    )
    result = snakemake(workdir, env, "-n", *args)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    return parse_jobs(output), output


def declared(job: dict) -> int | None:
    value = job["resources"].get("gpu")
    return None if value is None else int(value)


def test_every_gpu_job_declares_its_gpus_and_the_machines_count_is_scheduled(tmp_path):
    config = gpu_config([1, 2], gpus_per_node=2)
    jobs, output = dry_run(tmp_path, config, 2)
    assert "scalestudy: the local executor schedules 2 GPU(s) (NVML: 2 GPU(s))" in output
    seen = {job["rule"] for job in jobs}
    assert set(GPU_RULES) <= seen, set(GPU_RULES) - seen  # every kind of GPU job is planned
    for job in jobs:
        expected = GPU_RULES[job["rule"]](job["wildcards"], config) if job["rule"] in GPU_RULES else None
        assert declared(job) == expected, job
    assert {declared(job) for job in jobs if job["rule"] == "scaling_run"} == {1, 2}


def test_on_eight_gpus_each_job_gets_its_share_of_the_cores_and_gpu_n_overrides(tmp_path):
    config = gpu_config([1, 2, 4, 8], gpus_per_node=8)
    config["scaling"]["modes"] = ["strong"]  # one job per world size
    jobs, output = dry_run(tmp_path / "nvml", config, 8, "--cores", "16")
    assert "schedules 8 GPU(s) (NVML: 8 GPU(s))" in output
    scaling = {int(declared(job)): job for job in jobs if job["rule"] == "scaling_run"}
    assert sorted(scaling) == [1, 2, 4, 8]
    # threads: the job's share of the 16 cores, as its share of the 8 GPUs (1 GPU: 2 cores)
    assert {gpus: int(job["threads"]) for gpus, job in scaling.items()} == {1: 2, 2: 4, 4: 8, 8: 16}
    jobs, output = dry_run(tmp_path / "given", config, 8, "--cores", "16", "--resources", "gpu=4")
    assert "schedules 4 GPU(s) (--resources gpu=4)" in output
    assert "the study's largest job has 8 ranks, one GPU each, but 4 GPU(s) are scheduled here" in output
    # the 8-rank job asks for every GPU scheduled: it runs alone and its launcher stops it (exit 2)
    assert sorted(declared(job) for job in jobs if job["rule"] == "scaling_run") == [1, 2, 4, 4]


def test_a_cpu_study_on_a_gpu_machine_declares_no_gpu(tmp_path):
    jobs, output = dry_run(tmp_path, None, 2)  # the demo: train.device cpu
    assert jobs and all(declared(job) is None for job in jobs)
    assert "schedules" not in output


# --------------------------------------------------------------------------- real runs


# A command-workload script: records when each rank ran and what its launcher gave it; args
# "STAGE:starts:N" (this stage's ranks wait until N of them started: they run at the same time or
# fail) or "STAGE:file:PATH" (they wait for the file), at most 120 s.
PROBE = '''"""Records when this rank ran and the GPUs its launcher gave it."""
import json, os, sys, time
from scalestudy.contract import Reporter

reporter = Reporter.from_env()
config = reporter.run_config
record = sys.argv[1]
rules = dict(arg.split(":", 1) for arg in sys.argv[2:])
NAMES = ("CUDA_VISIBLE_DEVICES", "SCALESTUDY_GPU_UUIDS", "SCALESTUDY_GPU_SOURCE")


def write(event):
    line = {"event": event, "time": time.time(), "stage": config["stage"], "point": config["point"],
            "rank": os.environ.get("RANK"),
            **{k: os.environ.get(k) for k in NAMES}}
    with open(record, "a") as handle:
        handle.write(json.dumps(line) + "\\n")


def starts(stage):
    with open(record) as handle:
        lines = [json.loads(line) for line in handle]
    return sum(1 for line in lines if line["event"] == "start" and line["stage"] == stage)


def waiting(kind, value):
    if kind == "starts":
        return starts(config["stage"]) < int(value)
    return kind == "file" and not os.path.exists(value)


write("start")
kind, _, value = rules.get(config["stage"], "none:").partition(":")
deadline = time.monotonic() + 120
while waiting(kind, value):
    if time.monotonic() > deadline:
        sys.exit(3)
    time.sleep(0.05)
steps = config.get("max_steps_per_epoch") or 2
for epoch in range(1, config["epochs"] + 1):
    for _ in range(steps):
        reporter.step(samples=config["global_batch"], seconds=0.01, loss=1.0)
    reporter.epoch(epoch)
write("end")
'''


def probe_study(tmp_path: Path, name: str, worlds: list[int], *waits: str) -> tuple[Path, Path]:
    """A copy of the workflow whose study is the probe script at these world sizes; (folder, record)."""
    workdir = copy_workflow(tmp_path / name)
    (workdir / "gpu_probe.py").write_text(PROBE)
    record = tmp_path / f"{name}.jsonl"
    config = gpu_config(worlds, gpus_per_node=2)
    config["workload"] = {
        "name": "command",
        "command": {"script": "gpu_probe.py", "args": [str(record), *waits]},
    }
    config["train"].update(backend="gloo", epochs=1, max_steps_per_epoch=2)
    config["scaling"].update(modes=["strong"], repeats=2)
    config["site_check"] = {"enabled": False}  # its ranks check that torch sees the GPUs: none here
    config["tracking"] = {"enabled": False}
    (workdir / "config/gpu.yaml").write_text(yaml.safe_dump(config))
    return workdir, record


def lines(record: Path) -> list[dict]:
    return [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []


def spans(record: Path) -> dict[str, dict]:
    """Per job (stage/point): its ranks' GPUs as they saw them, its start and its end."""
    jobs: dict[str, dict] = {}
    for line in lines(record):
        job = jobs.setdefault(
            f"{line['stage']}/{line['point']}", {"start": line["time"], "end": line["time"]}
        )
        job["start"], job["end"] = min(job["start"], line["time"]), max(job["end"], line["time"])
        job.setdefault("seen", set()).add(
            (line["CUDA_VISIBLE_DEVICES"], line["SCALESTUDY_GPU_UUIDS"], line["SCALESTUDY_GPU_SOURCE"])
        )
    for job in jobs.values():
        ((visible, uuids, source),) = job.pop("seen")  # every rank of a job saw the same
        job.update(indices=visible.split(","), uuids=uuids.split(","), source=source)
    return jobs


def assert_no_gpu_shared_at_once(jobs: dict[str, dict]) -> None:
    names = sorted(jobs)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            if jobs[a]["start"] < jobs[b]["end"] and jobs[b]["start"] < jobs[a]["end"]:
                assert not set(jobs[a]["uuids"]) & set(jobs[b]["uuids"]), (a, b, jobs)


def test_two_one_gpu_points_run_at_once_on_disjoint_gpus(tmp_path):
    """Two 1-GPU training points on 2 GPUs: each rank waits until both started, so they ran at the
    same time or the run fails; the smoke step before them (1 GPU) shares no GPU with anything."""
    workdir, record = probe_study(tmp_path, "study", [1], "scaling:starts:2")
    env = gpufake.machine_env(
        gpufake.write_state(tmp_path / "nvml.json", 2), tmp_path / "locks", snakemake_env()
    )
    points = [f"results/runs/scaling/strong/w1_r{repeat}/summary.json" for repeat in (0, 1)]
    # 2 cores whatever this machine has: a 1-GPU job's threads are then 1 (2 cores x 1/2 GPUs)
    result = snakemake(workdir, env, *points, "--cores", "2", "--configfile", "config/gpu.yaml")
    assert result.returncode == 0, (result.stdout + result.stderr)[-6000:]
    jobs, names = spans(record), gpufake.uuids(2)
    assert set(jobs) == {"smoke/w1", "scaling/strong/w1_r0", "scaling/strong/w1_r1"}
    first, second = jobs["scaling/strong/w1_r0"], jobs["scaling/strong/w1_r1"]
    assert sorted(first["indices"] + second["indices"]) == ["0", "1"]
    for job in jobs.values():
        assert job["source"] == "local-lock" and job["uuids"] == [names[int(job["indices"][0])]]
    assert_no_gpu_shared_at_once(jobs)
    summary = json.loads((workdir / "results/runs/scaling/strong/w1_r0/summary.json").read_text())
    assert summary["provenance"]["gpus"] == {
        "source": "local-lock",
        "uuids": first["uuids"],
        "cuda_visible_devices": first["indices"][0],
    }
    assert [rank["gpu_uuid"] for rank in summary["provenance"]["ranks"]] == [None]  # the rank ran on the CPU
    log = (workdir / "results/logs/scaling/strong/w1_r0.log").read_text()
    assert f"launch: this job holds {first['uuids'][0]} (NVML {first['indices'][0]}) (local-lock" in log


def test_a_second_snakemake_on_the_machine_waits_for_the_gpu_the_first_ones_job_holds(tmp_path):
    """Snakemake A's 1-GPU job holds a GPU (its rank waits for a file); Snakemake B, in another folder
    on the same machine, asks for both GPUs (its 2-rank smoke step): B's launcher waits, saying which
    GPU is busy and whose it is, and starts only when A's job has ended."""
    state, locks = gpufake.write_state(tmp_path / "nvml.json", 2), tmp_path / "locks"
    env = gpufake.machine_env(state, locks, snakemake_env())
    release = tmp_path / "release"
    first, first_record = probe_study(tmp_path, "first", [1], f"smoke:file:{release}")
    second, second_record = probe_study(tmp_path, "second", [1, 2])
    a = snakemake_in_background(first, env, tmp_path / "first.out", "results/smoke/train_w1.json")
    b = None
    try:
        wait_until(lambda: lines(first_record), what="A's job started")
        b = snakemake_in_background(second, env, tmp_path / "second.out", "results/smoke/train_w2.json")
        log = second / "results/logs/smoke/train_w2.log"
        wait_until(lambda: log.exists() and "launch: waiting" in log.read_text(), what="B's launcher waits")
        time.sleep(2)
        assert not lines(second_record)  # still waiting: nothing of B started
        release.touch()
        assert a.wait(timeout=120) == 0, (tmp_path / "first.out").read_text()[-6000:]
        assert b.wait(timeout=300) == 0, (tmp_path / "second.out").read_text()[-6000:]
    finally:
        for process in (a, b):
            if process is not None and process.poll() is None:
                process.kill()
    held_by_a = spans(first_record)["smoke/w1"]
    got = spans(second_record)["smoke/w2"]
    assert got["uuids"] == gpufake.uuids(2) and got["start"] >= held_by_a["end"]
    waited = log.read_text()
    assert f"busy: {held_by_a['uuids'][0]} (NVML {held_by_a['indices'][0]}) held by pid" in waited
    assert f"scalestudy.train in {first}" in waited  # A's job, named by its workflow folder


def snakemake_in_background(workdir: Path, env: dict, out: Path, *targets: str) -> subprocess.Popen:
    """Snakemake on `targets` of the probe study, its output to the file `out`."""
    command = [sys.executable, "-m", "snakemake", "--profile", "profiles/local", *targets]
    with open(out, "w") as handle:
        return subprocess.Popen(
            [*command, "--configfile", "config/gpu.yaml"],
            cwd=workdir,
            env=env,
            stdout=handle,
            stderr=subprocess.STDOUT,
        )


def wait_until(condition, what: str, seconds: float = 180) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for: {what}"
        time.sleep(0.2)
