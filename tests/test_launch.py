"""scalestudy.launch.launcher: the command lines that start the ranks (plain, torchrun, srun + apptainer)."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from scalestudy import contract
from scalestudy.data.synthetic_cifar import generate_arrays
from scalestudy.launch import distributed, torchrun
from scalestudy.launch import launcher as launch
from scalestudy.plan import cluster
from tests.conftest import REPO
from tests.launch_specs import IN_JOB, NO_SLURM, TRAIN, spec


def command(world=1, environ=NO_SLURM, prefix=(), **changes) -> list[str]:
    return launch.build_command(spec(world, **changes), TRAIN, prefix, environ=environ, workdir="/work/study")


def test_one_local_rank_is_a_plain_process_of_this_interpreter():
    assert command(1) == [sys.executable, "-m", "scalestudy.train", *TRAIN]


def test_several_local_ranks_use_torchrun_standalone():
    assert command(2) == [
        sys.executable, "-m", "scalestudy.launch.torchrun", "--standalone", "--nnodes=1",
        "--nproc-per-node=2", "-m", "scalestudy.train", *TRAIN,
    ]  # fmt: skip


def test_a_rank_prefix_makes_torchrun_run_it_per_rank():
    argv = command(2, prefix=["nsys", "profile", "-o", "out dir/r%q{RANK}"])
    assert argv[6:] == [
        "--no-python", "nsys", "profile", "-o", "out dir/r%q{RANK}",
        sys.executable, "-m", "scalestudy.train", *TRAIN,
    ]  # fmt: skip


def test_in_a_slurm_job_each_rank_is_an_srun_task_with_explicit_cpus_and_the_nodes_gpus():
    assert command(8, IN_JOB) == [
        "srun", "--nodes=2", "--ntasks=8", "--ntasks-per-node=4", "--cpus-per-task=6",
        "--kill-on-bad-exit=1", "--label", "--gres=gpu:4",
        sys.executable, "-m", "scalestudy.train", *TRAIN,
    ]  # fmt: skip


def test_the_image_wraps_each_rank_inside_srun_and_the_prefix_goes_inside_the_image():
    argv = command(8, IN_JOB, prefix=["nsys", "profile"], containerized=True)
    srun_end = argv.index("apptainer")
    assert argv[0] == "srun" and all(arg.startswith("--") for arg in argv[1:srun_end])
    assert argv[srun_end:] == [
        "apptainer", "exec", "--nv", "--bind", "/work/study", "--bind", "/data:/data:ro",
        "/work/study/containers/scalestudy.sif",
        "nsys", "profile", "python", "-m", "scalestudy.train", *TRAIN,
    ]  # fmt: skip


def test_the_image_wraps_local_ranks_too_with_its_own_python():
    assert command(1, containerized=True)[:2] == ["apptainer", "exec"]
    argv = command(2, containerized=True)
    assert argv[argv.index("/work/study/containers/scalestudy.sif") + 1 :][:3] == [
        "python",
        "-m",
        "scalestudy.launch.torchrun",
    ]


@pytest.mark.parametrize(
    ("environ", "launcher", "expected"),
    [
        ({}, "auto", "local"),
        ({"SLURM_JOB_ID": "7"}, "auto", "srun"),
        ({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0"}, "auto", "local"),  # already inside an srun step
        ({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "4294967294"}, "auto", "srun"),  # the batch step
        ({}, "srun", "srun"),
        ({"SLURM_JOB_ID": "7"}, "local", "local"),
    ],
)
def test_auto_picks_srun_only_in_a_jobs_batch_step(environ, launcher, expected):
    assert launch.resolve_launcher({"launcher": launcher}, environ) == expected


def test_hostile_values_stay_single_arguments_and_the_logged_line_round_trips():
    hostile = [
        "--run-config-json",
        '{"x": "a b; rm -rf / $(id) `id` \'q\' \\"dq\\""}',
        "--out-dir",
        "r/$HOME",
    ]
    argv = launch.build_command(spec(8, containerized=True), hostile, ["nsys", "-o", "a b"], environ=IN_JOB)
    assert argv[-4:] == hostile
    assert shlex.split(shlex.join(argv)) == argv


def test_the_environment_carries_nccl_settings_and_the_image_into_the_container():
    config = {"nccl": {"NCCL_SOCKET_IFNAME": "=ib0,eth0", "NCCL_DEBUG": "INFO"}}  # shell syntax: refused
    the_spec = cluster.launch_spec(config, 2, containerized=True)
    env = launch.build_env(the_spec, {"PATH": "/bin", "SCALESTUDY_GIT_COMMIT": "abc"}, "f" * 64)
    assert env["NCCL_SOCKET_IFNAME"] == "=ib0,eth0" and env["OMP_NUM_THREADS"] == "8"
    assert env["SCALESTUDY_IMAGE"] == os.path.abspath("containers/scalestudy.sif")
    assert env["SCALESTUDY_IMAGE_SHA256"] == "f" * 64
    for name in ("NCCL_SOCKET_IFNAME", "NCCL_DEBUG", "SCALESTUDY_IMAGE_SHA256", "SCALESTUDY_GIT_COMMIT"):
        assert env[f"APPTAINERENV_{name}"] == env[name]
    plain = launch.build_env(cluster.launch_spec(config, 2), {"PATH": "/bin"})
    assert "SCALESTUDY_IMAGE" not in plain and not any(key.startswith("APPTAINERENV_") for key in plain)


def test_inherited_rendezvous_variables_do_not_reach_the_ranks():
    """A MASTER_ADDR left in the submitting shell would send the ranks of a two-node job to
    127.0.0.1; the ranks get the rendezvous from their launcher, or from the config."""
    inherited = {
        "PATH": "/bin",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
        "RANK": "0",
        "WORLD_SIZE": "1",
    }
    env = launch.build_env(cluster.launch_spec({}, 2), inherited)
    assert env["PATH"] == "/bin" and not set(launch.INHERITED_RENDEZVOUS) & set(env)
    chosen = launch.build_env(cluster.launch_spec({"nccl": {"MASTER_ADDR": "n1-ib"}}, 2), inherited)
    assert chosen["MASTER_ADDR"] == "n1-ib" and "MASTER_PORT" not in chosen


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"world_size": 0}, "world_size must be an integer >= 1, got 0"),
        ({"nodes": 1, "tasks_per_node": 2, "world_size": 3}, "world_size=3 does not fit"),
        ({"launcher": "mpirun"}, "launcher must be one of auto, local, srun, got 'mpirun'"),
        ({"env": {"NCCL_DEBUG": 1}}, "env must map variable names to strings"),
        ({"tasks": 3}, r"unknown launch spec key\(s\) \['tasks'\]"),
        ({"binds": "/data"}, "binds must be a list"),
    ],
)
def test_a_bad_spec_is_refused_naming_the_key(changes, message):
    with pytest.raises(launch.LaunchError, match=message):
        launch.check_spec({**spec(1), **changes})


def run_launch(*args: str, cwd: Path = REPO, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "scalestudy.launch", *args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize(
    "environ, named",
    [
        (
            {"SLURM_JOB_ID": "12", "SLURM_ARRAY_JOB_ID": "11", "SLURM_ARRAY_TASK_ID": "1"},
            "12 (array task 11_1)",
        ),
        ({"SLURM_JOB_ID": "13"}, "13"),
    ],
)
def test_the_attempts_first_log_line_names_its_slurm_job_and_array_task(environ, named, tmp_path, capsys):
    """Kept per attempt (scalestudy.launch.attempt_logs): an array task's log names the task as
    squeue/sacct/scancel take it (<array job>_<task>), since the retry may be another job."""
    launch.run_record_env(1, str(tmp_path / "point.log"), environ)
    assert capsys.readouterr().err.startswith(f"launch: attempt 1, Slurm job {named}, ")


def test_main_dry_run_prints_the_quoted_command():
    result = run_launch("--dry-run", "--launch-json", json.dumps(spec(8)), "--", *TRAIN, env=IN_JOB)
    assert result.returncode == 0, result.stderr
    expected = launch.build_command(spec(8), TRAIN, environ=IN_JOB, workdir=str(REPO))
    assert shlex.split(result.stdout) == expected


def test_main_reports_a_missing_image_or_launcher_clearly(tmp_path):
    missing = run_launch("--launch-json", json.dumps(spec(1, image="nowhere.sif")), "--", *TRAIN)
    assert missing.returncode == 2 and "image 'nowhere.sif'" in missing.stderr
    bad_json = run_launch("--launch-json", "{not json", "--", *TRAIN)
    assert bad_json.returncode == 2 and "--launch-json is not valid JSON" in bad_json.stderr
    no_srun = run_launch(
        "--launch-json", json.dumps(spec(2, launcher="srun")), "--", *TRAIN, env={"PATH": str(tmp_path)}
    )
    assert no_srun.returncode == 2 and "'srun' is not on PATH" in no_srun.stderr


def test_main_execs_the_trainer_and_passes_its_exit_status(tmp_path):
    fake = tmp_path / "scalestudy"
    (fake / "train").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "train/__init__.py").write_text("")
    shutil.copytree(REPO / "scalestudy/launch", fake / "launch")  # the launcher: pure stdlib
    (fake / "train/__main__.py").write_text(
        "import os, sys\n"
        "print('ARGS', sys.argv[1:], os.environ['NCCL_DEBUG'], os.environ['OMP_NUM_THREADS'])\n"
        "sys.exit(75)\n"
    )
    the_spec = cluster.launch_spec({"nccl": {"NCCL_DEBUG": "INFO,WARN"}}, 1)
    result = run_launch("--launch-json", json.dumps(the_spec), "--", *TRAIN, cwd=tmp_path)
    assert result.returncode == 75, result.stderr
    assert f"ARGS {TRAIN!r} INFO,WARN 8" in result.stdout
    assert "launch: " in result.stderr and "scalestudy.train" in result.stderr


def test_the_launcher_reads_the_image_digest_file_and_never_hashes(tmp_path, monkeypatch):
    """Rule image_digest hashes the image once (scalestudy.launch.container_image); the launcher reads its
    file."""
    from scalestudy.launch import container_image as imagedigest
    from tests.conftest import stub_apptainer

    monkeypatch.chdir(tmp_path)
    image = tmp_path / "image.sif"
    image.write_bytes(b"not really an image")
    digest = tmp_path / "image.sif.sha256.json"
    recorded = {**imagedigest.stamp(image), "sha256": "f" * 64}  # not the real hash: read, not computed
    digest.write_text(json.dumps(recorded))
    argv = ["--launch-json", json.dumps(spec(1, image=str(image), launcher="local")), "--", *TRAIN]
    environ = {"PATH": str(stub_apptainer(tmp_path / "bin")), imagedigest.DIGEST_ENV: str(digest)}
    _, env, _ = launch.prepare(argv, environ)
    assert env["SCALESTUDY_IMAGE_SHA256"] == env["APPTAINERENV_SCALESTUDY_IMAGE_SHA256"] == "f" * 64
    digest.unlink()
    assert launch.prepare(argv, environ)[1]["SCALESTUDY_IMAGE_SHA256"] == "unknown"
    digest.write_text(json.dumps({**recorded, "size": 1}))  # the image changed after its digest
    assert launch.prepare(argv, environ)[1]["SCALESTUDY_IMAGE_SHA256"].startswith("stale (")


# --- ranks die with their launcher --------------------------------------------------------------------

ARMED_CHILD = (
    "import sys, time\n"
    "from scalestudy.launch import distributed\n"
    "pid = int(sys.argv[1]) if len(sys.argv) > 1 else None\n"
    "print('armed', distributed.die_with_parent(pid), flush=True)\n"
    "time.sleep(60)\n"
)
MIDDLE = (
    "import subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', sys.argv[1]], stdout=subprocess.PIPE, text=True)\n"
    "print(child.pid, child.stdout.readline().strip(), flush=True)\n"
    "time.sleep(60)\n"
)


def _gone_within(pids, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while any(distributed.process_running(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _kill_all(pids) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_a_process_armed_by_die_with_parent_ends_when_its_parent_is_killed():
    middle = subprocess.Popen(
        [sys.executable, "-c", MIDDLE, ARMED_CHILD], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    child_pid, armed = middle.stdout.readline().split(" ", 1)
    try:
        assert armed.strip() == "armed True" and distributed.process_running(int(child_pid))
        middle.kill()
        middle.wait()
        assert _gone_within([int(child_pid)], 5)
    finally:
        _kill_all([int(child_pid)])


def test_a_rank_whose_launcher_died_before_it_armed_ends_at_once():
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    child = subprocess.run(
        [sys.executable, "-c", ARMED_CHILD, str(dead.pid)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert child.returncode == -signal.SIGKILL and f"launcher (pid {dead.pid}) is gone" in child.stderr
    alive = subprocess.run(
        [sys.executable, "-c", ARMED_CHILD.replace("60", "0"), str(os.getpid())], cwd=REPO, timeout=30
    )
    assert alive.returncode == 0  # a launcher that still runs (not the direct parent: a rank prefix)


def test_only_torchrun_ranks_arm_and_only_local_torchrun_without_an_image_gets_the_agents_pid():
    assert distributed.die_with_launcher({}) is False
    argv = ["--launch-json", json.dumps(spec(2, launcher="local")), "--", *TRAIN]
    assert launch.prepare(argv, NO_SLURM)[1][launch.LAUNCHER_PID_ENV] == str(os.getpid())
    one = ["--launch-json", json.dumps(spec(1, launcher="local")), "--", *TRAIN]
    assert launch.LAUNCHER_PID_ENV not in launch.prepare(one, NO_SLURM)[1]
    in_image = ["--dry-run", "--launch-json", json.dumps(spec(2, launcher="local", image="x.sif")), "--"]
    assert launch.LAUNCHER_PID_ENV not in launch.prepare([*in_image, *TRAIN], NO_SLURM)[1]


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as handle:
        return [int(child) for child in handle.read().split()]


def test_killing_the_torchrun_agent_of_a_two_rank_run_ends_both_ranks_and_writes_nothing(tmp_path):
    """The agent (scalestudy.launch.launcher exec'd into torchrun) is SIGKILLed mid-training: both ranks
    are gone within seconds, and no summary.json appears."""
    data = tmp_path / "packed"
    data.mkdir()
    names = ("train_images", "train_labels", "test_images", "test_labels")
    for name, array in zip(names, generate_arrays(8, 2, seed=0), strict=True):
        np.save(data / f"{name}.npy", array)
    run = {"world_size": 2, "per_gpu_batch": 8, "global_batch": 16, "epochs": 1000, "width": 4}
    run |= {"data_dir": str(data), "checkpoint_dir": str(tmp_path / "ckpt"), "device": "cpu"}
    run |= {"log_every_steps": 1, "monitor_interval_s": 5.0, "pg_timeout_s": 60, "checkpoint_every_steps": 0}
    out = tmp_path / "run"
    argv = ["--launch-json", json.dumps(spec(2, launcher="local")), "--"]
    argv += ["--run-config-json", json.dumps(run), "--out-dir", str(out)]
    env = {k: v for k, v in os.environ.items() if k not in launch.INHERITED_RENDEZVOUS}
    agent = subprocess.Popen(
        [sys.executable, "-m", "scalestudy.launch", *argv],
        cwd=REPO,
        env={**env, "OMP_NUM_THREADS": "1"},
        stderr=subprocess.PIPE,
        text=True,
    )
    ranks: list[int] = []
    try:
        log = []
        for line in agent.stderr:  # rank 0's progress lines: both ranks are training
            log.append(line)
            if "step 2/" in line:
                break
        ranks = _children(agent.pid)
        assert len(ranks) == 2, "".join(log)
        agent.kill()
        agent.wait()
        assert _gone_within(ranks, 60), "ranks outlived their torchrun agent"  # a ceiling: a busy host
        time.sleep(1)
        assert not (out / "summary.json").exists()
    finally:
        agent.kill()
        _kill_all(ranks)


def _local_ranks(script: str) -> subprocess.Popen:
    """Two local ranks of `script` (python -c) under the launcher's torchrun."""
    command = [sys.executable, "-m", launch.TORCHRUN_MODULE, "--standalone", "--nproc-per-node", "2"]
    command += ["--no-python", sys.executable, "-c", script]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.parametrize(("rank_exit", "expected"), [(75, 75), (3, 1), (0, 0)])
def test_local_ranks_exit_resumable_only_where_every_rank_did(rank_exit, expected):
    """torchrun itself exits 1 when its ranks exit 75; the launcher's exits 75 (the retry resumes),
    and any other failure stays torchrun's."""
    ranks = _local_ranks(f"import sys; sys.exit({rank_exit})")
    output, _ = ranks.communicate(timeout=120)
    assert ranks.returncode == expected, output[-3000:]


@pytest.mark.parametrize(("first_exit", "expected"), [(75, 75), (3, 1)])
def test_a_rank_closed_by_torchrun_after_another_stopped_keeps_the_run_resumable(first_exit, expected):
    """Rank 0 leaves first; torchrun's closing SIGTERM ends rank 1 (-15), as it can in a stopped run
    whose ranks leave a few milliseconds apart. After a stop (75) the run stays resumable; after a
    crash it stays torchrun's failure."""
    rank_0_leaves = f"sys.exit({first_exit}) if os.environ['LOCAL_RANK'] == '0' else time.sleep(120)"
    script = f"import os, sys, time; {rank_0_leaves}"
    ranks = _local_ranks(script)
    output, _ = ranks.communicate(timeout=120)
    assert "SIGTERM" in output, output[-3000:]
    assert ranks.returncode == expected, output[-3000:]


@pytest.mark.parametrize(
    ("exit_codes", "stopped"),
    [
        ((75, 75), True),
        ((75, -15), True),
        ((-15, 75), True),
        ((-15, -15), False),
        ((3, -15), False),
        ((75, 3), False),
    ],
)
def test_resumable_needs_a_stopped_rank_and_no_other_failure(exit_codes, stopped):
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    failures = {
        rank: ProcessFailure(rank, 1000 + rank, code, "<N/A>") for rank, code in enumerate(exit_codes)
    }
    assert torchrun.resumable(ChildFailedError("ranks", failures)) is stopped


def test_local_ranks_stopped_by_sigterm_exit_resumable():
    """SIGTERM to the agent (Snakemake stopping a local job): the ranks get it, save and exit 75;
    torchrun would exit 1, the launcher's exits 75.

    Each rank says it is ready in ONE write: under PYTHONUNBUFFERED (as here and in CI) `print`
    writes its text and its newline separately, and the two ranks' lines once came out as
    "rank readyrank ready": counted as one, the signal waited for the ranks' sleep to end (exit 0)."""
    script = (
        "import os, signal, sys, time; signal.signal(signal.SIGTERM, lambda *_: sys.exit(75)); "
        "os.write(1, b'rank ready\\n'); time.sleep(120)"
    )
    ranks = _local_ranks(script)
    ready, seen = 0, []
    for line in ranks.stdout:
        seen.append(line)
        ready += line.count("rank ready")
        if ready == 2:
            break
    assert ready == 2, "".join(seen)[-3000:]  # never signal ranks that already left
    ranks.send_signal(signal.SIGTERM)
    output, _ = ranks.communicate(timeout=120)
    assert ranks.returncode == contract.EXIT_RESUMABLE, output[-3000:]
