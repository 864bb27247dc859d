"""Faults of issue 23 in the trainer and the workflow, each as a demanding user's cluster produces
it: a damaged newest DCP checkpoint (item 1), a stop during the final writes (item 5), trainer
inputs that ended in a traceback (item 7), the venv's snakemake started without the venv on PATH
(item 10). A command workload's script faults: test_faults_command.py.

Real processes where a fault needs them: the trainer of a small LM under python -m scalestudy.train
or torchrun (1 and 2 ranks), and the venv's snakemake; the bad inputs and checkpoints in this process.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from scalestudy import contract
from tests import lm_runs
from tests.conftest import REPO
from tests.inprocess import write_packed_text
from tests.processes import LAUNCH_VARIABLES, STEP_LINE, child_env, global_step
from tests.run_configs import lm_run

# --- item 1: a damaged newest DCP checkpoint -------------------------------------------------------

LM = lm_run(epochs=1, monitor_interval_s=5.0, measure_steps=4, device="cpu")


@pytest.fixture(scope="module")
def tokens(tmp_path_factory) -> Path:
    return write_packed_text(tmp_path_factory.mktemp("lm"), corpus_bytes=60_000)


def _lm_config(tokens: Path, ckpt: Path, world_size: int, **changes) -> dict:
    config = {**LM, "world_size": world_size, "per_gpu_batch": LM["global_batch"] // world_size}
    return {**config, "data_dir": str(tokens), "checkpoint_dir": str(ckpt), **changes}


def _train(
    config: dict,
    out: Path,
    stop_at_step: int | None = None,
    stop_at: str | None = None,
    torchrun=False,
    **env,
) -> tuple[int, str]:
    """The trainer at config's world size (1: python -m scalestudy.train, or torchrun; 2: under
    torchrun), with SIGTERM once rank 0 logs global step `stop_at_step`, or a line holding
    `stop_at`. (exit code, log)"""
    command = [sys.executable, "-m", "scalestudy.train"]
    if config["world_size"] > 1 or torchrun:
        command = [sys.executable, "-m", "scalestudy.launch.torchrun", "--standalone", "--nproc-per-node"]
        command += [str(config["world_size"]), "-m", "scalestudy.train"]
    command += ["--run-config-json", json.dumps(config), "--out-dir", str(out)]
    process = subprocess.Popen(command, cwd=REPO, env=child_env(**env), stderr=subprocess.PIPE, text=True)
    lines = []
    for line in process.stderr:
        lines.append(line)
        step = global_step(line)
        if (stop_at_step is not None and step == stop_at_step) or (stop_at is not None and stop_at in line):
            process.send_signal(signal.SIGTERM)
            stop_at_step = stop_at = None
    process.wait(timeout=300)
    return process.returncode, "".join(lines)


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
    assert code == contract.EXIT_RESUMABLE, log[-3000:]  # 2 ranks too: scalestudy.launch.torchrun
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
        lm_runs.weights_at(sharded.latest(tmp_path / "ckpt")[1]),
        lm_runs.weights_at(sharded.latest(tmp_path / "ref-ckpt")[1]),
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


# --- item 5: a stop during the final writes ------------------------------------------------------------


def test_a_stop_during_the_final_writes_is_followed_by_a_retry_that_trains_no_step_again(tmp_path, tokens):
    """torchrun's agent SIGTERMed as rank 0 logs that it wrote the run folder: the attempt fails
    (the agent exits non-zero), the workflow removes the outputs and retries (attempt 2): the retry
    resumes the run's end from its last checkpoint, trains no step and writes the same outputs."""
    config = _lm_config(tokens, tmp_path / "ckpt", 1, keep_checkpoints=False)
    code, log = _train(config, tmp_path / "run", stop_at="wrote ", torchrun=True, SCALESTUDY_ATTEMPT="1")
    assert code != 0 and "wrote " in log, log[-3000:]
    first = json.loads((tmp_path / "run" / "summary.json").read_text())["results"]
    metrics = (tmp_path / "run" / "metrics.csv").read_text()
    shutil.rmtree(tmp_path / "run")  # Snakemake removes a failed job's outputs
    code, log = _train(config, tmp_path / "run", SCALESTUDY_ATTEMPT="2")
    assert code == 0, log[-3000:]
    assert not STEP_LINE.search(log), "the retry trained a step again"
    results = json.loads((tmp_path / "run" / "summary.json").read_text())["results"]
    assert results["resumes"] == [first["steps"]] and results["final_test_loss"] == first["final_test_loss"]
    assert (tmp_path / "run" / "metrics.csv").read_text().splitlines()[1:] == metrics.splitlines()[1:]


# --- item 7: trainer inputs that ended in a traceback -------------------------------------------------


@pytest.fixture
def no_process_group(monkeypatch):
    """The trainer in this process, one rank; starting any process group fails the test."""
    from scalestudy.launch import distributed
    from scalestudy.train import parallel

    for name in LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)

    def refuse(*_args, **_kwargs):
        raise AssertionError("a process group was started before the bad input was found")

    monkeypatch.setattr(distributed, "init_process_group", refuse)
    monkeypatch.setattr(parallel, "init_single_rank_group", refuse)


def test_a_batch_larger_than_the_lm_data_exits_2_naming_key_and_sizes(
    tmp_path, tokens, capsys, no_process_group
):
    from scalestudy.train import program

    config = _lm_config(
        tokens, tmp_path / "ckpt", 1, parallelism="fsdp", per_gpu_batch=4096, global_batch=4096
    )
    argv = ["--run-config-json", json.dumps(config), "--out-dir", str(tmp_path / "run")]
    assert program.main(argv) == 2
    err = capsys.readouterr().err
    assert "per_gpu_batch=4096 does not fit the data: data_dir" in err
    assert "windows of seq_len + 1 = 33 tokens" in err and "x 1 ranks: lower per_gpu_batch" in err
    assert not (tmp_path / "run").exists()


def test_a_batch_larger_than_the_image_data_exits_2_naming_key_and_sizes(tmp_path, capsys, no_process_group):
    import numpy as np

    from scalestudy.data.synthetic_cifar import generate_arrays
    from scalestudy.train import program

    data = tmp_path / "packed"
    data.mkdir()
    names = ("train_images", "train_labels", "test_images", "test_labels")
    for name, array in zip(names, generate_arrays(8, 2, seed=0), strict=True):
        np.save(data / f"{name}.npy", array)
    config = {"world_size": 1, "per_gpu_batch": 128, "global_batch": 128, "epochs": 1, "width": 4}
    config |= {"data_dir": str(data), "checkpoint_dir": str(tmp_path / "ckpt"), "device": "cpu"}
    argv = ["--run-config-json", json.dumps(config), "--out-dir", str(tmp_path / "run")]
    assert program.main(argv) == 2
    err = capsys.readouterr().err
    assert "per_gpu_batch=128 does not fit the data" in err
    assert (
        "gives 80 training images per rank (80 over 1 ranks), fewer than one batch of per_gpu_batch=128"
        in err
    )


def test_a_checkpoint_whose_tensors_do_not_fit_the_model_is_named(tmp_path):
    import torch

    from scalestudy.plan.runconfig import RunConfigError
    from scalestudy.train.checkpoint import dcp as sharded
    from scalestudy.train.checkpoint import policy

    small, large = torch.nn.Linear(4, 4), torch.nn.Linear(4, 6)
    config = {"world_size": 1, "per_gpu_batch": 4, "global_batch": 4, "epochs": 2}
    state = {"run_config": config, "resume_hash": sharded.resume_hash(config), "position": {"epoch": 0}}
    path = sharded.save(tmp_path, 3, small, torch.optim.SGD(small.parameters(), lr=0.1), state, is_main=True)
    with pytest.raises(RunConfigError) as caught:  # the trainer's exit 2
        sharded.load(path, large, torch.optim.SGD(large.parameters(), lr=0.1))
    assert f"checkpoint {path} does not fit the model: weight is [4, 4] in it, [6, 4] in the model" in str(
        caught.value
    )
    saved = {name: tuple(t.shape) for name, t in small.state_dict().items()}
    with pytest.raises(policy.CheckpointMismatch, match=r"bias is \[4\] in it, \[6\] in the model"):
        policy.check_fits("ckpt-1.pt", saved, large.state_dict())


# --- item 10: the venv's snakemake, not activated ----------------------------------------------------


def test_the_venvs_snakemake_runs_the_first_rules_without_the_venv_on_path(tmp_path):
    """`.venv/bin/snakemake --profile profiles/local` from cron or an editor: no venv on PATH, and a
    `python` there that is not the venv's. The rules' `python` is the interpreter Snakemake runs in
    (rules/common/hooks.smk: launcher.put_interpreter_first), so the demo's first rules run."""
    from conftest import copy_workflow

    workdir = copy_workflow(tmp_path / "workflow")
    system = tmp_path / "system-bin"
    system.mkdir()
    (system / "python").write_text("#!/bin/sh\necho 'the system python ran' >&2\nexit 97\n")
    (system / "python").chmod(0o755)
    env = {"PATH": f"{system}{os.pathsep}/usr/bin{os.pathsep}/bin", "HOME": os.environ.get("HOME", "/tmp")}
    snakemake = Path(sys.executable).parent / "snakemake"
    target = "results/data/packed/manifest.json"  # fetch (the synthetic archive), then preprocess
    result = subprocess.run(
        [str(snakemake), "--profile", "profiles/local", "--cores", "1", target],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    logs = "".join(path.read_text() for path in sorted((workdir / "results" / "logs").glob("*.log")))
    assert result.returncode == 0, result.stderr[-4000:] + logs[-3000:]
    assert "the system python ran" not in result.stderr + logs
    assert json.loads((workdir / target).read_text())["splits"]["train"]["count"] > 0
