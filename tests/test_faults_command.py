"""Faults of issue 23 in a command workload's script, each as a demanding user's cluster produces
it: scripts that ignore SIGTERM or leave children behind, a runner or torchrun agent SIGKILLed, a
failing script's stderr (items 3, 4 and 9). The trainer's and the workflow's: test_faults.py.

Real processes: the command workload's runner (scalestudy.workloads.command under python -m
scalestudy.train) at 1 rank, and under
torchrun (gloo-free: the runner needs no process group) at 2 ranks.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from scalestudy import contract
from scalestudy.launch.distributed import process_running
from scalestudy.train import program
from tests import processes
from tests.conftest import REPO

GRACE_S = 2.0

# A script whose rank starts a grandchild (ignoring SIGTERM too), writes both pids, then sleeps;
# mode "ignore": it ignores the stop signals; "saved": it reports a checkpoint on SIGTERM but
# does not exit; "fail": it writes to stderr and exits 3.
TREE = textwrap.dedent(
    """
    import json, os, signal, subprocess, sys, time
    from pathlib import Path
    folder, mode = Path(sys.argv[1]), sys.argv[2]
    if mode == "fail":
        for number in range(30):
            print(f"stderr line {number}", file=sys.stderr)
        print("RuntimeError: the last words", file=sys.stderr, flush=True)
        sys.exit(3)
    def saved(_signum, _frame):
        with open(os.environ["SCALESTUDY_PROGRESS"], "a") as handle:
            handle.write(json.dumps({"event": "saved", "step": 1}) + "\\n")
    for signum in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(signum, saved if mode == "saved" else signal.SIG_IGN)
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"
    child = subprocess.Popen([sys.executable, "-c", code])
    rank = os.environ["RANK"]
    (folder / f"tmp{rank}").write_text(f"{os.getppid()} {os.getpid()} {child.pid}")
    (folder / f"tmp{rank}").rename(folder / f"pids{rank}")
    time.sleep(300)
    """
)


@pytest.fixture
def tree(tmp_path) -> Path:
    (tmp_path / "tree.py").write_text(TREE)
    return tmp_path / "tree.py"


def child_env(**extra) -> dict[str, str]:
    """The environment of a process a test starts (tests/processes.py), with a short grace."""
    return processes.child_env(**{command_process_env(): str(GRACE_S), **extra})


def command_process_env() -> str:
    from scalestudy.workloads.command.process import GRACE_ENV

    return GRACE_ENV


def _run_config(tmp_path: Path, script: Path, mode: str, world_size: int = 1) -> dict:
    return {
        "workload": "command",
        "world_size": world_size,
        "per_gpu_batch": 4,
        "global_batch": 4 * world_size,
        "epochs": 1,
        "device": "cpu",
        "checkpoint_dir": str(tmp_path / "ckpt"),
        "monitor_interval_s": 5.0,
        "pg_timeout_s": 60,
        "command": {"script": str(script), "args": [str(tmp_path), mode]},
    }


def _argv(config: dict, out: Path) -> list[str]:
    return ["--run-config-json", json.dumps(config), "--out-dir", str(out)]


def _start(argv: list[str]) -> subprocess.Popen:
    return subprocess.Popen(argv, cwd=REPO, env=child_env(), stderr=subprocess.PIPE, text=True)


def _start_runner(tmp_path: Path, script: Path, mode: str) -> subprocess.Popen:
    """The one-rank trainer process running `script` in `mode` (its runner: scalestudy.train)."""
    argv = _argv(_run_config(tmp_path, script, mode), tmp_path / "run")
    return _start([sys.executable, "-m", "scalestudy.train", *argv])


def _pids(folder: Path, ranks: int, process: subprocess.Popen) -> list[int]:
    """(runner, script, grandchild) pids of every rank, once every rank has written them."""
    deadline = time.monotonic() + 600  # a generous ceiling: each rank imports torch first
    paths = [folder / f"pids{rank}" for rank in range(ranks)]
    while not all(path.exists() for path in paths):
        assert process.poll() is None, process.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the scripts did not start"
        time.sleep(0.05)
    return [int(pid) for path in paths for pid in path.read_text().split()]


def _gone_within(pids: list[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while any(process_running(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _kill_all(pids: list[int]) -> None:
    for pid in pids:
        if process_running(pid):
            os.kill(pid, signal.SIGKILL)


# --- item 3: a script that ignores SIGTERM ------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "code"), [("ignore", 128 + signal.SIGKILL), ("saved", contract.EXIT_RESUMABLE)]
)
def test_a_script_ignoring_sigterm_is_killed_after_the_grace_resumable_only_if_it_saved(
    tmp_path, tree, mode, code
):
    runner = _start_runner(tmp_path, tree, mode)
    pids = []
    try:
        pids = _pids(tmp_path, 1, runner)
        stopped = time.monotonic()
        runner.send_signal(signal.SIGTERM)
        log = runner.communicate(timeout=GRACE_S + 5)[1]
        assert time.monotonic() - stopped < GRACE_S + 5
        assert runner.returncode == code, log[-3000:]
        assert "still runs 2 s after the stop signal: killing its process group" in log
        assert _gone_within(pids, 5), "the script or its child outlived the grace"
    finally:
        runner.kill()
        _kill_all(pids)


def test_a_bad_stop_grace_is_named_before_the_script_starts(tmp_path, tree, monkeypatch, capsys):
    monkeypatch.setenv(command_process_env(), "soon")
    processes.without_launch_variables(monkeypatch)
    assert program.main(_argv(_run_config(tmp_path, tree, "ignore"), tmp_path / "run")) == 2
    assert "SCALESTUDY_STOP_GRACE_S='soon' must be a number of seconds > 0" in capsys.readouterr().err
    assert not (tmp_path / "pids0").exists()


# --- item 4: the whole tree of a rank dies with it ------------------------------------------------


def test_no_process_of_the_scripts_tree_survives_a_sigkill_of_the_runner(tmp_path, tree):
    runner = _start_runner(tmp_path, tree, "ignore")
    pids = []
    try:
        pids = _pids(tmp_path, 1, runner)
        assert pids[0] == runner.pid
        runner.kill()
        runner.wait()
        assert _gone_within(pids, 5), "the script or its child outlived the SIGKILLed runner"
    finally:
        runner.kill()
        _kill_all(pids)


def test_no_process_of_either_ranks_tree_survives_a_sigkill_of_the_torchrun_agent(tmp_path, tree):
    agent = _start(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
        + [
            "-m",
            "scalestudy.train",
            *_argv(_run_config(tmp_path, tree, "ignore", 2), tmp_path / "run"),
        ]
    )
    pids = []
    try:
        pids = _pids(tmp_path, 2, agent)  # both ranks: runner, script, grandchild
        assert len(set(pids)) == 6
        agent.kill()
        agent.wait()
        assert _gone_within(pids, 10), "a rank's runner, script or child outlived the torchrun agent"
    finally:
        agent.kill()
        _kill_all(pids)


def test_a_finished_script_leaves_no_child_running(tmp_path):
    script = tmp_path / "leaves.py"
    script.write_text(
        textwrap.dedent(
            """
            import subprocess, sys
            from pathlib import Path
            from scalestudy.contract import Reporter
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
            Path(sys.argv[1], "child").write_text(str(child.pid))
            reporter = Reporter.from_env()
            reporter.step(4, 0.01)
            """
        )
    )
    config = {**_run_config(tmp_path, script, "ok"), "measure_warmup_steps": 1, "measure_steps": 1}
    config["command"]["args"] = [str(tmp_path)]
    result = subprocess.run(
        [sys.executable, "-m", "scalestudy.train", *_argv(config, tmp_path / "run")],
        cwd=REPO,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    child = int((tmp_path / "child").read_text())
    try:
        assert _gone_within([child], 5), "the script's child outlived the finished run"
    finally:
        _kill_all([child])


# --- item 9: a failing script is an ERROR with its last lines of stderr ------------------------------


def test_a_failing_script_is_logged_at_error_with_its_last_lines_of_stderr(tmp_path, tree):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "scalestudy.train",
            *_argv(_run_config(tmp_path, tree, "fail"), tmp_path / "run"),
        ],
        cwd=REPO,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 3
    error = result.stderr[
        result.stderr.index("ERROR scalestudy.workloads.command: rank 0: script exited with 3") :
    ]
    assert "its last lines of stderr:\nstderr line 11\nstderr line 12\n" in error  # the last 20, in order
    assert "stderr line 29\nRuntimeError: the last words" in error
    assert "stderr line 10\n" in result.stderr and "stderr line 10\n" not in error  # passed through, not kept
