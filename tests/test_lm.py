"""The GPT workload through the trainer: tokens as the unit, FSDP2 against DDP, DCP checkpoints
that resume bit-exactly at a fixed world size and reshard 2 -> 1 -> 2 ranks with the same global
batch. CPU and gloo; 2-rank runs under torchrun."""

from __future__ import annotations

import json
import logging
import math
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
import torch.distributed.checkpoint as dcp

from scalestudy import contract
from scalestudy.data import synthetic_text as textcorpus
from scalestudy.data import tokenize
from scalestudy.train import program
from scalestudy.train import trainer as train
from scalestudy.train.checkpoint import dcp as sharded_checkpoint
from scalestudy.workloads.gpt import model as gpt_model

REPO = Path(__file__).resolve().parent.parent
GPT = {"layers": 2, "heads": 2, "d_model": 32, "seq_len": 32, "vocab_size": None}
BASE = {
    "workload": "gpt",
    "gpt": GPT,
    "world_size": 1,
    "per_gpu_batch": 16,
    "global_batch": 16,
    "base_batch": 16,
    "epochs": 2,
    "precision": "fp32",  # the equivalence tests compare weights in fp32 (the schema's default is bf16)
    "lr": 0.003,
    "weight_decay": 0.1,
    "grad_clip": 1.0,
    "seed": 0,
    "deterministic": True,
    "max_steps_per_epoch": 8,
    "eval_max_batches": 2,
    "checkpoint_every_steps": 3,
    "log_every_steps": 1,
    "monitor_interval_s": 0.5,
    "measure_warmup_steps": 2,
    "measure_steps": 10,
    "measure_intervals": 2,
    "keep_checkpoints": True,  # the tests compare the finished runs' weights
    "pg_timeout_s": 60,
}
TWO_RANKS = {"world_size": 2, "per_gpu_batch": 8}
STEP_LINE = re.compile(r"epoch (\d+)/\d+ step (\d+)/(\d+) ")
LAUNCH_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")


def _environ() -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARIABLES and not k.startswith("SLURM_")}
    return {**keep, "OMP_NUM_THREADS": "1"}


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch):
    for name in set(os.environ) - set(_environ()) - {"OMP_NUM_THREADS"}:
        monkeypatch.delenv(name)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lm")
    textcorpus.write_corpus(folder / "corpus.txt", 120_000, seed=3)
    argv = ["--corpus", str(folder / "corpus.txt"), "--out-dir", str(folder / "packed"), "--seq-len", "32"]
    assert tokenize.main(argv) == 0
    return folder / "packed"


@pytest.fixture(scope="module")
def runs(tmp_path_factory, data_dir):
    root = tmp_path_factory.mktemp("runs")

    def make(name, checkpoints=None, **changes):
        folder = root / name
        ckpt = root / (checkpoints or name) / "ckpt"
        config = {**BASE, "data_dir": str(data_dir), "checkpoint_dir": str(ckpt), **changes}
        config["global_batch"] = config["per_gpu_batch"] * config["world_size"]
        return folder / "run", ckpt, config

    return make


def _main(out, config) -> int:
    argv = ["--run-config-json", json.dumps(config), "--out-dir", str(out), "--log-level", "WARNING"]
    return program.main(argv)


def _torchrun(out, config, stop_at_step: int | None = None) -> tuple[int, str]:
    """2 ranks under torchrun; with stop_at_step, SIGTERM to the launcher (which passes it to the
    ranks) once rank 0 logs that global step. Returns (exit code, log)."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    command += ["-m", "scalestudy.train", "--run-config-json", json.dumps(config), "--out-dir", str(out)]
    process = subprocess.Popen(command, cwd=REPO, env=_environ(), stderr=subprocess.PIPE, text=True)
    lines = []
    for line in process.stderr:
        lines.append(line)
        if stop_at_step is not None and _global_step(line, config) == stop_at_step:
            process.send_signal(signal.SIGTERM)
            stop_at_step = None
    process.wait(timeout=300)
    return process.returncode, "".join(lines)


def _global_step(line: str, config) -> int | None:
    match = STEP_LINE.search(line)
    return (int(match[1]) - 1) * int(match[3]) + int(match[2]) if match else None


class _SignalAtStep(logging.Handler):
    """SIGTERM to this process when the trainer logs global step `step` (between steps)."""

    def __init__(self, step: int) -> None:
        super().__init__()
        self.step = step

    def emit(self, record) -> None:
        if _global_step(record.getMessage(), None) == self.step:
            os.kill(os.getpid(), signal.SIGTERM)

    def __enter__(self):
        train.log.addHandler(self)
        train.log.setLevel(logging.INFO)
        return self

    def __exit__(self, *exc):
        train.log.removeHandler(self)
        train.log.setLevel(logging.NOTSET)


def _weights(ckpt: Path) -> dict[str, torch.Tensor]:
    """The model of the newest DCP checkpoint in `ckpt`, loaded into a plain GPT (whatever sharding
    wrote it)."""
    _, path = sharded_checkpoint.latest(ckpt)
    cfg = gpt_model.config_from(GPT, 256)
    state = {"model": gpt_model.GPT(cfg).state_dict()}
    dcp.load(state, checkpoint_id=str(path))
    return state["model"]


def _metrics(out: Path) -> pd.DataFrame:
    return pd.read_csv(out / "metrics.csv")[["epoch", "train_loss", "train_acc", "test_loss", "test_acc"]]


def _results(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())["results"]


@pytest.fixture(scope="module")
def reference(runs):
    out, ckpt, config = runs("reference")
    assert _main(out, config) == 0
    return out, ckpt, config


@pytest.fixture(scope="module")
def two_rank_runs(runs):
    """Uninterrupted 2-rank runs, DDP and FSDP2, of the reference's global batch."""
    done = {}
    for parallelism in ("ddp", "fsdp"):
        out, ckpt, config = runs(f"two_{parallelism}", parallelism=parallelism, **TWO_RANKS)
        code, log = _torchrun(out, config)
        assert code == 0, log[-5000:]
        done[parallelism] = (out, ckpt, config)
    return done


def test_the_lm_learns_and_reports_in_tokens(reference):
    out, _, config = reference
    results, metrics = _results(out), pd.read_csv(out / "metrics.csv")
    assert results["workload"] == "gpt" and results["sample_unit"] == "tokens"
    assert results["metric"] == "perplexity" and results["optimizer"] == "adamw"
    assert metrics["train_loss"].iloc[-1] < metrics["train_loss"].iloc[0] < math.log(256)
    assert results["final_test_perplexity"] == pytest.approx(math.exp(results["final_test_loss"]))
    cfg = gpt_model.config_from(GPT, 256)
    assert results["train_flops_per_image"] == gpt_model.train_flops_per_token(cfg)
    assert results["parameters"] == gpt_model.parameter_count(cfg)
    # every step trains per_gpu_batch x seq_len tokens: the window's rate is tokens per second
    assert results["images_per_s"] == pytest.approx(
        results["measured_steps"] * config["global_batch"] * GPT["seq_len"] / results["measured_s"]
    )
    # fp32 parameters, their gradients, AdamW's two moments: 16 bytes a parameter on one rank
    assert results["model_state_bytes_per_rank"] == 16 * results["parameters"]
    assert results["peak_memory_source"] == "cpu_peak_rss" and results["peak_memory_bytes"] > 0


def test_a_killed_lm_run_resumes_bit_exactly(runs, reference):
    out, ckpt, config = runs("signal")
    with _SignalAtStep(5):
        assert _main(out, config) == contract.EXIT_RESUMABLE
    assert sharded_checkpoint.latest(ckpt)[0]["position"]["global_step"] == 5
    assert _main(out, config) == 0
    theirs, ours = _weights(reference[1]), _weights(ckpt)
    assert [k for k in ours if not torch.equal(ours[k], theirs[k])] == []
    pd.testing.assert_frame_equal(_metrics(out), _metrics(reference[0]))
    assert _results(out)["resumes"] == [5]


def _relative_difference(a: dict, b: dict, start: dict) -> float:
    """|a - b| over how far the weights moved from `start` (the initialisation)."""
    flat = {name: torch.cat([t[k].flatten().double() for k in sorted(t)]) for name, t in (("a", a), ("b", b))}
    moved = flat["a"] - torch.cat([start[k].flatten().double() for k in sorted(start)])
    return float((flat["a"] - flat["b"]).norm() / moved.norm())


def _initial_weights() -> dict:
    torch.manual_seed(BASE["seed"])
    return gpt_model.GPT(gpt_model.config_from(GPT, 256)).state_dict()


def test_fsdp2_and_ddp_train_the_same_weights(two_rank_runs, reference):
    ddp, fsdp = _weights(two_rank_runs["ddp"][1]), _weights(two_rank_runs["fsdp"][1])
    start = _initial_weights()
    assert _relative_difference(fsdp, ddp, start) < 1e-4
    assert _relative_difference(ddp, _weights(reference[1]), start) < 1e-4  # 2 x 8 trains like 1 x 16
    fsdp_results, ddp_results = _results(two_rank_runs["fsdp"][0]), _results(two_rank_runs["ddp"][0])
    assert fsdp_results["parallelism"] == "fsdp" and fsdp_results["fsdp_options"]["shard_units"] == 2
    # FSDP2 holds half of the model state on each of 2 ranks (up to the shards' padding)
    assert fsdp_results["model_state_bytes_per_rank"] < 0.55 * ddp_results["model_state_bytes_per_rank"]
    assert len(fsdp_results["peak_memory_bytes_per_rank"]) == 2


def test_a_checkpoint_reshards_from_two_ranks_to_one_and_back(runs, two_rank_runs):
    """FSDP2 at 2 x 8 stopped near step 4, resumed at 1 x 16 and stopped near step 10, finished at 2 x 8:
    the same loss curve as the uninterrupted 2-rank run, within float rounding."""
    out, ckpt, config = runs("reshard", parallelism="fsdp", **TWO_RANKS)
    code, log = _torchrun(out, config, stop_at_step=4)
    assert code != 0 and "exit 75" in log, log[-3000:]
    saved = sharded_checkpoint.latest(ckpt)[0]["position"]["global_step"]
    # the step the signal reached the ranks in, or the next (they agree on it); the launcher passes
    # it on a moment after the log line
    assert 4 <= saved < 10
    one_rank = runs("reshard", parallelism="fsdp", checkpoints="reshard")[2]
    with _SignalAtStep(10):
        assert _main(out, one_rank) == contract.EXIT_RESUMABLE
    # FSDP2 runs one rank in a process group too: the stop is agreed on after the next step
    second = sharded_checkpoint.latest(ckpt)[0]["position"]["global_step"]
    assert second in (10, 11)
    code, log = _torchrun(out, config)
    assert code == 0, log[-5000:]
    reference_out, reference_ckpt, _ = two_rank_runs["fsdp"]
    pd.testing.assert_frame_equal(_metrics(out), _metrics(reference_out), rtol=1e-4)
    start = _initial_weights()
    assert _relative_difference(_weights(ckpt), _weights(reference_ckpt), start) < 1e-4
    assert _results(out)["resumes"] == [saved, second]


def test_a_resume_that_would_change_the_global_batch_is_refused(runs, reference, capsys):
    out, ckpt, config = runs("refused")
    with _SignalAtStep(3):
        assert _main(out, config) == contract.EXIT_RESUMABLE
    bigger = {**config, "per_gpu_batch": 32, "global_batch": 32}
    assert _main(out, bigger) == program.EXIT_BAD_CONFIG
    message = capsys.readouterr().err
    assert "global_batch=16" in message and "global_batch=32" in message
    assert sharded_checkpoint.latest(ckpt) is not None  # nothing was removed
