"""Faults of issue 23, each as a demanding user's cluster produces it: scripts that ignore SIGTERM or
leave children behind, a runner or torchrun agent SIGKILLed, a failing script's stderr.

Real processes: the command workload's runner (scalestudy.workloads.command) at 1 rank, and under
torchrun (gloo-free: the runner needs no process group) at 2 ranks.
"""

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from scalestudy.launch.rendezvous import process_running
from scalestudy.workloads.command import contract
from scalestudy.workloads.command import runner as command

REPO = Path(__file__).resolve().parent.parent
LAUNCH_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")
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


def _env(**extra) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARIABLES and not k.startswith("SLURM_")}
    return {**env, "OMP_NUM_THREADS": "1", command_process_env(): str(GRACE_S), **extra}


def command_process_env() -> str:
    from scalestudy.workloads.command.process import GRACE_ENV

    return GRACE_ENV


def _run_config(tmp_path: Path, script: Path, mode: str, world_size: int = 1) -> dict:
    return {
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
    return subprocess.Popen(argv, cwd=REPO, env=_env(), stderr=subprocess.PIPE, text=True)


def _pids(folder: Path, ranks: int, process: subprocess.Popen) -> list[int]:
    """(runner, script, grandchild) pids of every rank, once every rank has written them."""
    deadline = time.monotonic() + 60
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
    runner = _start(
        [
            sys.executable,
            "-m",
            "scalestudy.workloads.command",
            *_argv(_run_config(tmp_path, tree, mode), tmp_path / "run"),
        ]
    )
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
    for name in LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert command.main(_argv(_run_config(tmp_path, tree, "ignore"), tmp_path / "run")) == 2
    assert "SCALESTUDY_STOP_GRACE_S='soon' must be a number of seconds > 0" in capsys.readouterr().err
    assert not (tmp_path / "pids0").exists()


# --- item 4: the whole tree of a rank dies with it ------------------------------------------------


def test_no_process_of_the_scripts_tree_survives_a_sigkill_of_the_runner(tmp_path, tree):
    runner = _start(
        [
            sys.executable,
            "-m",
            "scalestudy.workloads.command",
            *_argv(_run_config(tmp_path, tree, "ignore"), tmp_path / "run"),
        ]
    )
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
            "scalestudy.workloads.command",
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
            from scalestudy.workloads.command.contract import Reporter
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
        [sys.executable, "-m", "scalestudy.workloads.command", *_argv(config, tmp_path / "run")],
        cwd=REPO,
        env=_env(),
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
            "scalestudy.workloads.command",
            *_argv(_run_config(tmp_path, tree, "fail"), tmp_path / "run"),
        ],
        cwd=REPO,
        env=_env(),
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


# --- item 1: a damaged newest DCP checkpoint -------------------------------------------------------

GPT = {"layers": 2, "heads": 2, "d_model": 32, "seq_len": 32, "vocab_size": None}
LM = {
    "workload": "gpt",
    "gpt": GPT,
    "epochs": 1,
    "lr": 0.003,
    "weight_decay": 0.1,
    "grad_clip": 1.0,
    "seed": 0,
    "deterministic": True,
    "max_steps_per_epoch": 8,
    "eval_max_batches": 2,
    "checkpoint_every_steps": 3,
    "log_every_steps": 1,
    "monitor_interval_s": 5.0,
    "measure_warmup_steps": 2,
    "measure_steps": 4,
    "measure_intervals": 2,
    "keep_checkpoints": True,
    "pg_timeout_s": 60,
    "device": "cpu",
}
STEP_LINE = re.compile(r"epoch (\d+)/\d+ step (\d+)/(\d+) ")


@pytest.fixture(scope="module")
def tokens(tmp_path_factory) -> Path:
    from scalestudy.data import synthetic_text, tokenize

    folder = tmp_path_factory.mktemp("lm")
    synthetic_text.write_corpus(folder / "corpus.txt", 60_000, seed=3)
    argv = ["--corpus", str(folder / "corpus.txt"), "--out-dir", str(folder / "packed"), "--seq-len", "32"]
    assert tokenize.main(argv) == 0
    return folder / "packed"


def _lm_config(tokens: Path, ckpt: Path, world_size: int, **changes) -> dict:
    per_gpu = 16 // world_size
    config = {**LM, "world_size": world_size, "per_gpu_batch": per_gpu, "global_batch": 16, "base_batch": 16}
    return {**config, "data_dir": str(tokens), "checkpoint_dir": str(ckpt), **changes}


def _train(config: dict, out: Path, stop_at_step: int | None = None) -> tuple[int, str]:
    """The trainer at config's world size (1: python -m scalestudy.train; 2: under torchrun), with
    SIGTERM once rank 0 logs global step `stop_at_step`. (exit code, log)"""
    command = [sys.executable, "-m", "scalestudy.train"]
    if config["world_size"] > 1:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
        command += ["-m", "scalestudy.train"]
    command += ["--run-config-json", json.dumps(config), "--out-dir", str(out)]
    process = subprocess.Popen(command, cwd=REPO, env=_env(), stderr=subprocess.PIPE, text=True)
    lines = []
    for line in process.stderr:
        lines.append(line)
        match = STEP_LINE.search(line)
        step = (int(match[1]) - 1) * int(match[3]) + int(match[2]) if match else None
        if stop_at_step is not None and step == stop_at_step:
            process.send_signal(signal.SIGTERM)
            stop_at_step = None
    process.wait(timeout=300)
    return process.returncode, "".join(lines)


def _lm_weights(path: Path) -> dict:
    import torch.distributed.checkpoint as dcp

    from scalestudy.workloads.gpt import model as gpt_model

    state = {"model": gpt_model.GPT(gpt_model.config_from(GPT, 256)).state_dict()}
    dcp.load(state, checkpoint_id=str(path))
    return state["model"]


@pytest.mark.parametrize(
    ("world_size", "parallelism", "shard"), [(1, "ddp", "__0_0.distcp"), (2, "fsdp", "__1_0.distcp")]
)
def test_a_damaged_newest_dcp_checkpoint_is_set_aside_and_the_one_before_resumed(
    tmp_path, tokens, world_size, parallelism, shard
):
    """Issue 23, item 1: a shard of the newest checkpoint cut in half (1 rank; rank 1's under FSDP2
    at 2 ranks): the retry names it, sets it aside, resumes from the one before and finishes with
    the uninterrupted run's weights."""
    import torch

    from scalestudy.train.checkpoint import dcp as sharded

    reference = _lm_config(tokens, tmp_path / "ref-ckpt", world_size, parallelism=parallelism)
    code, log = _train(reference, tmp_path / "ref")
    assert code == 0, log[-3000:]
    config = _lm_config(tokens, tmp_path / "ckpt", world_size, parallelism=parallelism)
    code, log = _train(config, tmp_path / "run", stop_at_step=4)
    assert code == contract.EXIT_RESUMABLE or "exit 75" in log, log[-3000:]
    (_, newest), older = sharded.latest(tmp_path / "ckpt"), sharded._candidates(tmp_path / "ckpt")[1][1]
    assert newest != older and (newest / shard).is_file()
    data = (newest / shard).read_bytes()
    (newest / shard).write_bytes(data[: len(data) // 2])
    code, log = _train(config, tmp_path / "run")
    assert code == 0, log[-5000:]
    assert f"checkpoint {newest} is damaged ({shard} has {len(data) // 2} bytes" in log
    assert (tmp_path / "ckpt" / "damaged" / newest.name / shard).is_file()
    resumed = json.loads((tmp_path / "run" / "summary.json").read_text())["results"]["resumes"]
    assert resumed == [int(older.name.split("-")[1])]
    ours, theirs = (
        _lm_weights(sharded.latest(tmp_path / "ckpt")[1]),
        _lm_weights(sharded.latest(tmp_path / "ref-ckpt")[1]),
    )
    assert [name for name in ours if not torch.equal(ours[name], theirs[name])] == []


def test_when_no_dcp_checkpoint_can_be_resumed_the_run_starts_over_saying_so(tmp_path, caplog):
    import logging

    import torch

    from scalestudy.train.checkpoint import dcp as sharded

    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(model.parameters())
    config = {"world_size": 1, "per_gpu_batch": 4, "global_batch": 4, "epochs": 2, "lr": 0.1}
    state = {"run_config": config, "resume_hash": sharded.resume_hash(config), "position": {"epoch": 0}}
    folders = [sharded.save(tmp_path, step, model, optimizer, state, is_main=True) for step in (3, 6)]
    assert sharded.claim(tmp_path, config)[1] == folders[1]  # intact: the newest
    (folders[1] / ".metadata").write_bytes(b"garbage")
    (folders[0] / "__0_0.distcp").unlink()
    with caplog.at_level(logging.WARNING, logger="scalestudy.checkpoint"):
        assert sharded.claim(tmp_path, config) is None
    assert "its .metadata does not load" in caplog.text and "__0_0.distcp is missing" in caplog.text
    assert "no checkpoint in it can be resumed (see damaged/): starting from scratch" in caplog.text
    assert sorted(p.name for p in (tmp_path / "damaged").iterdir()) == [f.name for f in folders]
