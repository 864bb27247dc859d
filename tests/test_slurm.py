"""The study on a real (throw-away) Slurm cluster: tests/slurm/cluster.sh brings up slurmctld and two
slurmd nodes, n1 and n2, each in its own network namespace, on this machine (Debian slurm-wlm + munge;
root and apt-get needed, else these tests are skipped with the reason).

- the demo study (a smaller grid) through Snakemake's Slurm executor to the report, every rule but
  fetch a real Slurm job; two-rank points span both nodes (gloo across the namespaces);
- a training job stopped at its time limit (2 minutes, --signal=USR1) is retried and resumes;
- the real study's GPU requests (2 nodes x 4 GPUs for world 8) are accepted by Slurm (sbatch
  --test-only against nodes with 4 fake GPUs each).

About 10 minutes on 2 cores. The cluster is left up if it was already up, else brought down.
"""

from __future__ import annotations

import fcntl
import json
import math
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from scalestudy import cluster
from tests.conftest import REPO, copy_workflow, snakemake_env

pytestmark = pytest.mark.slurm

CLUSTER_SH = REPO / "tests/slurm/cluster.sh"
PROFILE = REPO / "tests/slurm/profile"
LOCK = Path("/tmp/scalestudy-slurm.lock")
SUBMITTED = re.compile(r"Job \d+ has been submitted with SLURM jobid (\d+) \(log: (\S+)\)\.")


class Cluster:
    def __init__(self, nodes: int) -> None:
        self.nodes = nodes
        self.client = ["bash", str(CLUSTER_SH), "exec"]

    def run(self, *command: str, timeout: int = 60, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*self.client, *command], capture_output=True, text=True, timeout=timeout, **kwargs
        )

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` as a dict (finished jobs stay for MinJobAge = 1 hour)."""
        result = self.run("scontrol", "show", "job", "--oneliner", job_id)
        assert result.returncode == 0, result.stderr
        return dict(field.split("=", 1) for field in result.stdout.split() if "=" in field)


def cluster_script(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(CLUSTER_SH), *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def slurm():
    """The two-node cluster (one node where network namespaces are unavailable)."""
    with LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one test session on the cluster at a time
        status = cluster_script("status").stdout.split()
        started = status[:1] != ["up"]
        if started:
            result = cluster_script("up-two-node")
            if result.returncode == 77:  # e.g. no network namespaces in this container: one node
                result = cluster_script("up")
            if result.returncode == 77:
                pytest.skip(result.stderr.strip().splitlines()[-1])
            assert result.returncode == 0, f"cluster bring-up failed:\n{result.stderr[-4000:]}"
            status = cluster_script("status").stdout.split()
        yield Cluster(int(status[1]))
        if started:
            cluster_script("down")


def write_config(workdir: Path, name: str, change) -> str:
    """config/demo.yaml, changed by `change(config)`, as a config file of the workflow copy."""
    config = yaml.safe_load((REPO / "config/demo.yaml").read_text())
    change(config)
    path = workdir / "config" / name
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return str(path.relative_to(workdir))


def snakemake(slurm: Cluster, workdir: Path, *args: str, timeout: int) -> subprocess.CompletedProcess:
    """Snakemake with the test profile, in the cluster's client namespace; SIGINT on timeout (it
    cancels its jobs then; it ignores SIGTERM while waiting for them)."""
    command = ["timeout", "-s", "INT", "-k", "20", str(timeout)]
    command += [sys.executable, "-m", "snakemake", "--profile", str(PROFILE), *args]
    return slurm.run(*command, cwd=workdir, env=snakemake_env(), timeout=timeout + 60)


def submitted(output: str) -> dict[str, Path]:
    """Slurm job id -> its Slurm log, from Snakemake's output."""
    return {job_id: Path(log) for job_id, log in SUBMITTED.findall(output)}


def summaries(workdir: Path) -> dict[str, dict]:
    runs = workdir / "results/runs"
    return {
        str(path.parent.relative_to(runs)): json.loads(path.read_text())
        for path in sorted(runs.glob("**/summary.json"))
    }


def shorter_demo(slurm: Cluster):
    def change(config: dict) -> None:
        config["scaling"]["modes"] = ["strong"]
        config["sensitivity"].update(per_gpu_batch=[16], bucket_cap_mb=[25], precision=["fp32"])
        config["profiling"]["world_sizes"] = [2]
        config["train"].update(epochs=2, max_steps_per_epoch=6)  # what runs is tested, not accuracy
        # Two ranks span both nodes: gloo across the network namespaces.
        config["cluster"]["ranks_per_node"] = 1 if slurm.nodes == 2 else 2
        # Every rule a Slurm job but fetch, which stays on the submit host (the internet is there).
        config["cluster"]["submit_host_rules"] = ["fetch"]

    return change


@pytest.fixture(scope="module")
def demo(slurm, tmp_path_factory):
    """The demo study (a smaller grid) through the Slurm executor, then its report."""
    workdir = copy_workflow(tmp_path_factory.mktemp("slurm-demo") / "scalestudy")
    configfile = write_config(workdir, "slurm-demo.yaml", shorter_demo(slurm))
    started = time.monotonic()
    run = snakemake(slurm, workdir, "--configfile", configfile, timeout=900)
    output = run.stdout + run.stderr
    assert run.returncode == 0, f"the demo failed through Slurm:\n{output[-8000:]}"
    report = snakemake(
        slurm, workdir, "--configfile", configfile, "--report", "results/report.html", timeout=300
    )
    assert report.returncode == 0, report.stderr[-4000:]
    print(f"demo through Slurm: {time.monotonic() - started:.0f} s, {len(submitted(output))} Slurm jobs")
    return workdir, output


def test_the_demo_reaches_the_report_with_every_rule_but_fetch_a_slurm_job(demo, slurm):
    workdir, output = demo
    assert (workdir / "results/report.html").stat().st_size > 100_000
    jobs = submitted(output)
    as_jobs = {log.relative_to(workdir / ".snakemake/slurm_logs").parts[0] for log in jobs.values()}
    planned = set(re.findall(r"^(?:local)?rule (\w+):", output, re.M)) - {"all", "fetch"}
    assert len(planned) > 10 and as_jobs == {f"rule_{rule}" for rule in planned}
    assert re.search(r"^localrule fetch:", output, re.M)  # cluster.submit_host_rules
    for job_id, log in jobs.items():
        assert log.is_file(), f"Slurm log of job {job_id} missing: {log}"
        state = slurm.job(job_id)
        assert state["JobState"] == "COMPLETED", (job_id, state.get("JobState"), log.read_text()[-2000:])
        assert state["Comment"].startswith("rule_"), state["Comment"]


def test_every_run_records_the_slurm_job_that_made_it(demo, slurm):
    workdir, output = demo
    jobs = submitted(output)
    runs = summaries(workdir)
    expected = {"baseline/default", "scaling/strong/w1_r0", "scaling/strong/w2_r0", "profile/w2"}
    assert expected <= set(runs), sorted(runs)
    job_ids = [run["provenance"]["slurm"]["job_id"] for run in runs.values()]
    assert len(set(job_ids)) == len(runs), "two runs claim the same Slurm job"
    for point, run in runs.items():
        job_id = run["provenance"]["slurm"]["job_id"]
        assert job_id in jobs, f"{point}: job {job_id} is not one Snakemake submitted"
        rule = f"rule_{point.split('/')[0]}_run"
        assert jobs[job_id].relative_to(workdir / ".snakemake/slurm_logs").parts[0] == rule
        assert slurm.job(job_id)["NumTasks"] == str(run["results"]["world_size"])
    manifest = json.loads((workdir / "results/data/packed/manifest.json").read_text())
    assert manifest["provenance"]["slurm"]["job_id"] in jobs  # preprocess: a CPU job


def test_a_two_rank_point_spans_both_nodes_with_one_result(demo, slurm):
    if slurm.nodes < 2:
        pytest.skip("network namespaces are unavailable here: the cluster has one node")
    workdir, _ = demo
    run = summaries(workdir)["scaling/strong/w2_r0"]
    assert run["provenance"]["hosts"] == ["n1", "n2"]
    assert run["results"]["world_size"] == 2 and run["results"]["backend"] == "gloo"
    assert slurm.job(run["provenance"]["slurm"]["job_id"])["NodeList"] == "n[1-2]"
    assert sorted(p.name for p in (workdir / "results/runs/scaling/strong/w2_r0").glob("summary*")) == [
        "summary.json"
    ]


def steps_for(seconds: float, images_per_s: float, batch: int) -> int:
    return max(50, math.ceil(seconds * images_per_s / batch))


def test_a_training_job_killed_at_its_time_limit_is_retried_and_resumes(demo, slurm, tmp_path):
    """Attempt 1 has 2 minutes and SIGUSR1 30 s before its end (Slurm may send it up to a minute
    early, sbatch(1): after at least half a minute, when the trainer has its handlers); the run
    needs longer: its length is set from the demo's speed. The retry gets 10 minutes and must resume
    from the checkpoint. On nodes with fake GPUs the job also takes the GPU request path
    (--gres=gpu:1 on sbatch and srun), training on the CPU."""
    demo_dir, _ = demo
    workdir = copy_workflow(tmp_path / "scalestudy")
    shutil.copytree(demo_dir / "results/data", workdir / "results/data")  # no fetch/preprocess again
    speed = summaries(demo_dir)["scaling/strong/w1_r0"]["results"]["images_per_s"]  # same loader
    steps = steps_for(240, speed, 64)  # ~4 min of training at the (contended) demo's speed

    def change(config: dict) -> None:
        config["baseline"].update(loader="tensor")
        config["train"].update(epochs=math.ceil(steps / 25), max_steps_per_epoch=None, eval_max_batches=1)
        config["train"].update(checkpoint_every_steps=50)
        config["cluster"].update(runtime_minutes=2, signal_lead_s=30, runtime_growth=5.0, gpus_per_node=4)
        config["cluster"]["ranks_per_node"] = None

    configfile = write_config(workdir, "slurm-timelimit.yaml", change)
    target = "results/runs/baseline/default/summary.json"
    run = snakemake(slurm, workdir, "--configfile", configfile, "--retries", "3", target, timeout=900)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-8000:]
    attempts = [job for job, log in submitted(output).items() if "rule_baseline_run" in str(log)]
    assert len(attempts) >= 2, f"the job was not retried:\n{output[-4000:]}"
    first = slurm.job(attempts[0])
    assert first["TimeLimit"] == "00:02:00"
    if slurm.run("sinfo", "--noheader", "-o", "%G").stdout.strip().startswith("gpu:"):
        assert first["TresPerNode"] == "gres:gpu:1", first  # the GPU request path, on fake GPUs
    # Either Slurm's --signal reached the ranks first (they checkpoint and exit 75: FAILED), or the
    # limit did (SIGTERM, the same checkpoint, then TIMEOUT).
    assert first["JobState"] in ("TIMEOUT", "FAILED"), first["JobState"]
    summary = json.loads((workdir / target).read_text())
    assert summary["results"]["resumed_from_step"], summary["results"]
    assert summary["provenance"]["slurm"]["job_id"] == attempts[-1]
    assert slurm.job(attempts[1])["TimeLimit"] == "00:10:00"  # the retry got more time
    log = (workdir / "results/logs/baseline/default.log").read_text()
    assert re.search(r"resumed from \S+: epoch \d+", log), log[-3000:]
    print(
        f"time-limit retry: {len(attempts)} attempts, first {first['JobState']}, resumed from step "
        f"{summary['results']['resumed_from_step']} of {steps}"
    )


@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_slurm_accepts_the_real_studys_gpu_requests(slurm, world, tmp_path):
    """config/config.yaml's geometry (4 GPUs per node), with CPUs and memory shrunk to the toy
    nodes, through the plugin's own sbatch builder, checked by `sbatch --test-only`."""
    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    config["cluster"].update(cpus_per_rank=1, mem_mb_per_rank=100)
    nodes, per_node = cluster.layout(config, world)
    if nodes > slurm.nodes:
        pytest.skip(f"world {world} needs {nodes} nodes; the test cluster has {slurm.nodes}")
    sbatch = cluster.sbatch_command(cluster.train_resources(config, world, 1), threads=world)
    result = slurm.run("sh", "-c", f"{sbatch} --test-only --wrap=true", cwd=tmp_path)
    assert result.returncode == 0, f"{sbatch}\n{result.stderr}"
    match = re.search(r"using (\d+) processors on nodes (\S+)", result.stderr)
    assert match, result.stderr
    assert int(match[1]) == world  # one CPU per rank here
    hosts = subprocess.run(
        [*slurm.client, "scontrol", "show", "hostnames", match[2]], capture_output=True, text=True
    ).stdout.split()
    assert len(hosts) == nodes, (sbatch, result.stderr)
    assert shlex.split(sbatch).count(f"--gres=gpu:{per_node}") == 1


def test_nothing_is_left_running(slurm):
    queue = slurm.run("squeue", "--noheader", "--states=PENDING,RUNNING", "-o", "%i %j %T")
    assert queue.returncode == 0 and not queue.stdout.strip(), queue.stdout
