"""What the Slurm route needs that runs without a cluster: the Slurm job's record in provenance
(scontrol), per-attempt logs, the run config's node count on CPU clusters, the two Slurm profiles,
and `source scripts/bootstrap.sh` leaving the user's shell as it was."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from scalestudy.launch import attempt_logs as attemptlog
from scalestudy.launch import launcher as launch
from scalestudy.launch import slurm_job
from scalestudy.plan import grid
from tests.conftest import REPO

SCONTROL = (
    "JobId=42 JobName=e3c9a1f0-uuid UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=1 "
    "Nice=0 Account=studyacct QOS=normal JobState=RUNNING Reason=None Dependency=(null) "
    "Restarts=0 BatchFlag=1 NumNodes=2 NumCPUs=2 NumTasks=2 CPUs/Task=1 Partition=debug "
    "NodeList=n[1-2] Comment=rule_scaling_run_wildcards_strong_2_0 WorkDir=/tmp/a dir/with space "
    "StdOut=/tmp/x.log TresPerNode=gres:gpu:1\n"
)


def scontrol(stdout: str = SCONTROL, returncode: int = 0):
    calls = []

    def runner(argv, **kwargs):
        calls.append(argv)
        return SimpleNamespace(returncode=returncode, stdout=stdout, stderr="")

    runner.calls = calls
    return runner


def test_scontrol_show_job_is_parsed_with_values_that_contain_spaces():
    fields = slurm_job.parse_scontrol_job(SCONTROL)
    assert fields["JobId"] == "42" and fields["NumNodes"] == "2" and fields["Account"] == "studyacct"
    assert fields["WorkDir"] == "/tmp/a dir/with space"
    assert fields["CPUs/Task"] == "1" and fields["TresPerNode"] == "gres:gpu:1"


def test_slurm_state_takes_the_jobs_name_nodes_and_account_from_its_record():
    """In the rule's shell the jobstep plugin removed SLURM_JOB_NUM_NODES/ACCOUNT, and srun set
    SLURM_JOB_NAME to the step's program: the job's record wins."""
    environ = {"SLURM_JOB_ID": "42", "SLURM_JOB_NAME": "python"}
    passed = slurm_job.slurm_job_env(environ, runner=scontrol())
    state = slurm_job.slurm_state({**environ, **passed}, runner=scontrol(returncode=1))
    assert state["job_id"] == "42"
    assert (state["job_name"], state["job_num_nodes"], state["job_account"]) == (
        "e3c9a1f0-uuid",
        "2",
        "studyacct",
    )
    assert (state["job_nodelist"], state["job_partition"], state["ntasks"]) == ("n[1-2]", "debug", "2")


def test_slurm_state_without_a_record_keeps_the_variables():
    assert slurm_job.slurm_job_env({"SLURM_JOB_ID": "42"}, runner=scontrol(returncode=1)) == {}
    assert slurm_job.slurm_job_env({}, runner=scontrol()) == {}
    other_job = {slurm_job.SLURM_JOB_ENV: json.dumps({"job_id": "7", "job_account": "x"})}
    failing = scontrol(returncode=1)
    state = slurm_job.slurm_state(
        {"SLURM_JOB_ID": "42", "SLURM_JOB_NAME": "job", **other_job}, runner=failing
    )
    assert state["job_name"] == "job" and state["job_account"] is None  # not another job's record
    unused = scontrol()
    assert slurm_job.slurm_state({}, runner=unused)["job_id"] is None and not unused.calls


def test_the_attempt_is_recorded():
    assert slurm_job.attempt({slurm_job.ATTEMPT_ENV: "3"}) == 3
    assert slurm_job.attempt({}) is None


def test_every_attempt_keeps_its_log(tmp_path):
    log = tmp_path / "logs/scaling/strong/w2_r0.log"
    log.parent.mkdir(parents=True)
    # an earlier run of the point left attempts 1 and 2
    for number in (1, 2):
        attemptlog.attempt_log(log, number).write_text(f"old attempt {number}\n")
    log.write_text("")
    first = attemptlog.keep(log, 1)
    assert first.name == "w2_r0.attempt1.log" and sorted(attemptlog.attempt_logs(log)) == [1]
    with log.open("a") as out:
        out.write("attempt 1: SIGUSR1, checkpoint at step 50\n")
    assert first.read_text() == "attempt 1: SIGUSR1, checkpoint at step 50\n"
    log.unlink()  # what Snakemake does to the declared log before the retry runs
    with log.open("w") as out:  # the retry's shell redirect
        attemptlog.keep(log, 2)
        out.write("attempt 2: resumed\n")
    assert first.read_text() == "attempt 1: SIGUSR1, checkpoint at step 50\n"
    assert attemptlog.attempt_log(log, 2).read_text() == log.read_text() == "attempt 2: resumed\n"
    assert sorted(attemptlog.attempt_logs(log)) == [1, 2]
    with pytest.raises(ValueError, match="attempt"):
        attemptlog.keep(log, 0)


def test_the_launcher_keeps_the_attempts_log_and_passes_the_attempt_to_the_ranks(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    log = tmp_path / "run.log"
    spec = json.dumps({"world_size": 1, "launcher": "local"})
    argv = ["--launch-json", spec, "--log", str(log), "--attempt", "2", "--", "--out-dir", "x"]
    command, env, _ = launch.prepare(argv, {"PATH": os.environ["PATH"]})
    assert env[slurm_job.ATTEMPT_ENV] == "2"
    assert (tmp_path / "run.attempt2.log").samefile(log)
    assert command[-2:] == ["--out-dir", "x"]
    with pytest.raises(launch.LaunchError, match="--attempt"):
        launch.prepare([*argv[:5], "0", *argv[6:]], {"PATH": os.environ["PATH"]})


@pytest.mark.parametrize(("ranks_per_node", "world", "nodes"), [(2, 2, 1), (1, 2, 2), (1, 1, 1), (2, 4, 2)])
def test_the_run_config_names_the_nodes_slurm_gets_on_cpu_nodes(demo_config, ranks_per_node, world, nodes):
    """gpus_per_node 0 (CPU nodes): the layout comes from ranks_per_node (the trainer warned
    'run config nodes=1 but the ranks run on 2 hosts' for every 2-node run)."""
    demo_config["cluster"].update(gpus_per_node=0, ranks_per_node=ranks_per_node)
    point = grid.scaling_point(demo_config, "weak", world, 0)
    assert grid.run_config(demo_config, point)["nodes"] == nodes


def test_the_run_config_names_the_nodes_of_gpu_nodes(demo_config):
    demo_config["cluster"].update(gpus_per_node=4, ranks_per_node=None)
    runs = [grid.run_config(demo_config, grid.scaling_point(demo_config, "weak", w, 0)) for w in (1, 4, 8)]
    assert [run["nodes"] for run in runs] == [1, 1, 2]


def profile(name: str) -> dict:
    return yaml.safe_load((REPO / "profiles" / name / "config.yaml").read_text())


def test_the_container_less_profile_is_the_slurm_profile_without_apptainer():
    with_image, without = profile("slurm"), profile("slurm-noapptainer")
    apptainer = {"software-deployment-method", "apptainer-args"}
    assert with_image["software-deployment-method"] == "apptainer"
    assert not apptainer & set(without)
    assert {key: value for key, value in with_image.items() if key not in apptainer} == without


def test_both_slurm_profiles_poll_with_squeue():
    """sacct hangs the plugin on clusters without accounting; squeue works on both kinds."""
    for name in ("slurm", "slurm-noapptainer"):
        settings = profile(name)
        assert settings["slurm-status-command"] == "squeue"
        # the plugin falls back to sacct where MinJobAge < 3 x this; Slurm's default is 300 s
        assert 3 * settings["slurm-init-seconds-before-status-checks"] < 300
        assert settings["seconds-between-status-checks"] * 5 <= 300


# ----------------------------------------------------------------------------- bootstrap


@pytest.fixture
def bootstrap_copy(tmp_path):
    """scripts/bootstrap.sh in a copy whose .venv links to this checkout's (nothing to install)."""
    venv = REPO / ".venv"
    if not (venv / ".requirements.sha256").is_file():
        pytest.skip("no bootstrapped .venv in this checkout to link to")
    copy = tmp_path / "checkout"
    for part in (
        "scripts/bootstrap.sh",
        "scripts/uv_index_args.py",
        "envs/requirements.txt",
        "envs/requirements-dev.txt",
        "envs/requirements.lock",
        "pyproject.toml",
    ):
        (copy / part).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / part, copy / part)
    (copy / ".venv").symlink_to(venv)
    return copy


OPTIONS = 'echo "options: $- $(set -o | grep -E "^(errexit|nounset|pipefail)" | tr -s " \\t" " " | xargs)"'


def interactive_bash(copy: Path, script: str) -> subprocess.CompletedProcess:
    """`bash -i` reading `script` from stdin, as a user's terminal would run it."""
    env = {key: value for key, value in os.environ.items() if key not in ("VIRTUAL_ENV", "BASH_ENV")}
    env["PATH"] = "/usr/bin:/bin"
    return subprocess.run(
        ["bash", "--norc", "--noprofile", "-i"],
        input=script,
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_sourcing_bootstrap_leaves_the_interactive_shells_options_alone(bootstrap_copy):
    result = interactive_bash(
        bootstrap_copy,
        f"{OPTIONS}\nsource scripts/bootstrap.sh\necho status=$?\n{OPTIONS}\nfalse\n"
        'echo "python=$(command -v python)"\necho still-open\n',
    )
    options = [line for line in result.stdout.splitlines() if line.startswith("options:")]
    assert len(options) == 2 and options[0] == options[1], result.stdout + result.stderr
    assert "errexit off" in options[1] and "nounset off" in options[1] and "pipefail off" in options[1]
    assert "status=0" in result.stdout and "still-open" in result.stdout, result.stderr
    assert f"python={bootstrap_copy}/.venv/bin/python" in result.stdout


def test_a_failing_bootstrap_returns_to_the_shell_and_exits_a_script(bootstrap_copy):
    (bootstrap_copy / "pyproject.toml").write_text("# changed: the shared .venv does not match\n")
    result = interactive_bash(
        bootstrap_copy, f"source scripts/bootstrap.sh\necho status=$?\n{OPTIONS}\necho still-open\n"
    )
    assert "status=1" in result.stdout and "still-open" in result.stdout, result.stdout + result.stderr
    assert "a link to a shared environment" in result.stderr
    executed = subprocess.run(
        ["bash", "scripts/bootstrap.sh"], cwd=bootstrap_copy, capture_output=True, text=True
    )
    assert executed.returncode == 1
