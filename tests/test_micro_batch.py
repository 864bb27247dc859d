"""Gradient accumulation (train.micro_batch, scalestudy.train.accumulation; issue 42): the GPT trained
in chunks of half the per-GPU batch ends with the weights and loss curve of the one-pass run (float
summation order apart), on one rank and on two DDP ranks; a killed accumulating run resumes bit
for bit; a micro_batch that does not divide the per-GPU batch is refused naming both. CPU, tiny."""

# ruff: noqa: F811 - the fixtures imported from tests/lm_runs.py are the tests' parameters

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from scalestudy import contract
from scalestudy.benchmark import lm
from scalestudy.contract import EXIT_BAD_CONFIG
from scalestudy.data.synthetic_cifar import generate_arrays
from scalestudy.plan import configcheck, runconfig
from scalestudy.plan.grid import Point
from scalestudy.train import accumulation
from scalestudy.train.checkpoint import dcp as sharded_checkpoint
from tests import lm_runs
from tests.inprocess import SignalAtStep, one_process_one_thread  # noqa: F401 - autouse
from tests.lm_runs import TWO_RANKS, data_dir, runs  # noqa: F401 - the LM's token data and run folders
from tests.run_configs import resnet_run
from tests.trainer_runs import main

RESNET = resnet_run(  # ResNet-18 at width 8, two steps of 16 images
    epochs=1,
    max_steps_per_epoch=2,
    eval_max_batches=1,
    checkpoint_every_steps=0,
    measure_warmup_steps=1,
    measure_steps=1,
    measure_intervals=1,
)
SHORT = {"epochs": 1, "max_steps_per_epoch": 4}  # a few optimizer steps
# SGD without clipping: its step is proportional to the gradient, so a chunk's loss weighed wrongly
# shows in the weights (AdamW and clipping would normalise a gradient off by a constant factor away)
SCALE_SENSITIVE = {"optimizer": "sgd", "grad_clip": None, "lr": 0.1, "momentum": 0.9}


def _count_chunks(monkeypatch) -> list[int]:
    """The number of chunks of every training step from now on (accumulation.chunks spied on)."""
    split, real_chunks = [], accumulation.chunks

    def counted_chunks(x, y, micro_batch):
        chunks = real_chunks(x, y, micro_batch)
        split.append(len(chunks))
        return chunks

    monkeypatch.setattr(accumulation, "chunks", counted_chunks)
    return split


def _same_training(accumulated: tuple, whole: tuple) -> None:
    """The same weights (relative to how far they moved, 1e-5) and loss curve (rtol 1e-5)."""
    ours, theirs = lm_runs.weights(accumulated[1]), lm_runs.weights(whole[1])
    start = lm_runs.initial_weights()
    assert lm_runs.relative_difference(ours, theirs, start) < 1e-5
    assert any(not torch.equal(theirs[key], start[key]) for key in start)  # they trained: not vacuous
    got, want = lm_runs.metrics(accumulated[0]), lm_runs.metrics(whole[0])
    assert got["train_loss"].tolist() == pytest.approx(want["train_loss"].tolist(), rel=1e-5)
    assert got["train_acc"].tolist() == pytest.approx(want["train_acc"].tolist(), abs=1e-3)


def test_half_batch_chunks_train_the_one_pass_weights(runs, monkeypatch):
    split = _count_chunks(monkeypatch)
    done = {}
    for name, micro in (("whole", None), ("halves", 8)):
        out, ckpt, config = runs(f"micro_{name}", **SHORT, **SCALE_SENSITIVE, micro_batch=micro)
        assert main(out, config) == 0
        done[name] = (out, ckpt)
    assert split == [1] * 4 + [2] * 4  # the second run took each step in two chunks
    _same_training(done["halves"], done["whole"])


def test_fsdp2_accumulates_to_its_one_pass_weights(runs):
    """FSDP2 (one rank, its own process group): the gradients reduce-scattered in the last chunk only
    (set_requires_gradient_sync), the same training as one pass."""
    done = {}
    for name, micro in (("whole", None), ("halves", 8)):
        changes = {"parallelism": "fsdp", **SHORT, **SCALE_SENSITIVE, "micro_batch": micro}
        out, ckpt, config = runs(f"micro_fsdp_{name}", **changes)
        assert main(out, config) == 0
        done[name] = (out, ckpt)
    _same_training(done["halves"], done["whole"])


def test_two_ddp_ranks_accumulate_to_the_one_pass_weights(runs):
    done = {}
    for name, micro in (("whole", None), ("halves", 4)):
        out, ckpt, config = runs(
            f"micro_ddp_{name}", parallelism="ddp", **TWO_RANKS, **SHORT, micro_batch=micro
        )
        code, log = lm_runs.torchrun(out, config)
        assert code == 0, log[-5000:]
        done[name] = (out, ckpt)
    _same_training(done["halves"], done["whole"])
    # DDP's static graph is off while accumulating: no_sync() fails its first iteration
    static = {name: lm_runs.results(out)["ddp_options"]["static_graph"] for name, (out, _) in done.items()}
    assert static == {"whole": True, "halves": False}


def test_a_killed_accumulating_run_resumes_bit_exactly(runs):
    finals = {}
    for name, stop in (("straight", None), ("stopped", 5)):
        out, ckpt, config = runs(f"micro_resume_{name}", epochs=2, max_steps_per_epoch=4, micro_batch=4)
        if stop:
            with SignalAtStep(stop):
                assert main(out, config) == contract.EXIT_RESUMABLE
            assert sharded_checkpoint.latest(ckpt)[0]["position"]["global_step"] == stop
        assert main(out, config) == 0
        finals[name] = (out, lm_runs.weights(ckpt))
    (straight_out, straight), (stopped_out, stopped) = finals["straight"], finals["stopped"]
    assert [key for key in straight if not torch.equal(straight[key], stopped[key])] == []
    assert lm_runs.metrics(stopped_out).equals(lm_runs.metrics(straight_out))
    assert lm_runs.results(stopped_out)["resumes"] == [5]


def test_the_resnet_accumulates_with_batch_norm_over_each_chunk(tmp_path, monkeypatch):
    """The ResNet trains in chunks too; its batch norm normalises over a chunk, so its training is
    not the one-pass run's (docs: train.micro_batch)."""
    arrays = generate_arrays(16, 4, seed=0)
    for name, array in zip(
        ("train_images", "train_labels", "test_images", "test_labels"), arrays, strict=True
    ):
        np.save(tmp_path / f"{name}.npy", array)
    split = _count_chunks(monkeypatch)
    losses = {}
    for name, micro in (("whole", None), ("halves", 8)):
        config = {**RESNET, "data_dir": str(tmp_path), "checkpoint_dir": str(tmp_path / name / "ckpt")}
        assert main(tmp_path / name, {**config, "micro_batch": micro}) == 0
        losses[name] = lm_runs.metrics(tmp_path / name)["train_loss"].tolist()
    assert split == [1] * 2 + [2] * 2
    assert all(math.isfinite(loss) for loss in losses["halves"]) and losses["halves"] != losses["whole"]


def test_a_micro_batch_that_does_not_divide_the_batch_is_refused_naming_both():
    config = {**runconfig.DEFAULTS, "data_dir": "d", "checkpoint_dir": "c", "world_size": 2, "epochs": 1}
    config.update(per_gpu_batch=16, global_batch=32, micro_batch=6)
    with pytest.raises(runconfig.RunConfigError, match=r"micro_batch=6 does not divide per_gpu_batch=16"):
        runconfig.validate(config)
    runconfig.validate({**config, "micro_batch": 4})  # a divisor, and null, are fine
    runconfig.validate({**config, "micro_batch": None})


def test_the_workflow_refuses_a_micro_batch_some_grid_point_cannot_split():
    points = [
        Point("scaling", "strong_w2", 2, (("per_gpu_batch", 64),)),
        Point("scaling", "strong_w4", 4, (("per_gpu_batch", 32),)),
        Point("sensitivity", "bs16", 1, (("per_gpu_batch", 16), ("micro_batch", 16))),
    ]
    problems = configcheck.micro_batch_problems({"train": {"micro_batch": 48}}, points)
    assert problems == [
        "train.micro_batch=48 does not divide per_gpu_batch=64: use a divisor of it, or null (the whole "
        "per-GPU batch in one pass) (grid point scaling/strong_w2)",
        "train.micro_batch=48 does not divide per_gpu_batch=32: use a divisor of it, or null (the whole "
        "per-GPU batch in one pass) (grid point scaling/strong_w4)",
    ]
    assert configcheck.micro_batch_problems({"train": {"micro_batch": 16}}, points) == []


def test_gradients_are_synchronised_in_the_last_chunk_only():
    """DDP's require_backward_grad_sync is off inside the other chunks (no_sync); FSDP2 is told."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        ddp = DistributedDataParallel(torch.nn.Linear(2, 2))
        with accumulation.gradient_sync(ddp, sync=False):
            assert not ddp.require_backward_grad_sync
        with accumulation.gradient_sync(ddp, sync=True):
            assert ddp.require_backward_grad_sync
    finally:
        dist.destroy_process_group()

    class FakeFsdp(torch.nn.Module):
        told: list[bool] = []

        def set_requires_gradient_sync(self, sync: bool) -> None:
            self.told.append(sync)

    fsdp = FakeFsdp()
    for sync in (False, True):
        with accumulation.gradient_sync(fsdp, sync=sync):
            pass
    assert fsdp.told == [False, True]


def test_chunks_weigh_the_batch_and_leave_a_whole_batch_alone():
    x, y = torch.arange(12.0).reshape(6, 2), torch.arange(6)
    assert accumulation.chunks(x, y, None)[0][0] is x and accumulation.chunks(x, y, 6)[0][2] == 1.0
    parts = accumulation.chunks(x, y, 4)  # the last chunk smaller (a short batch)
    assert [len(c[1]) for c in parts] == [4, 2] and [c[2] for c in parts] == [4 / 6, 2 / 6]
    assert torch.equal(torch.cat([c[0] for c in parts]), x)


def test_the_lm_benchmark_passes_micro_batch_to_the_trainer(tmp_path, capsys):
    """--micro-batch reaches the run config; one that does not divide --per-gpu-batch is refused as
    the trainer would refuse it, before anything runs; 0 by the argument check."""
    args = lm.parse_args(["--device", "cpu", "--per-gpu-batch", "16", "--micro-batch", "4"])
    assert lm.run_config(args, "ddp", tmp_path, tmp_path / "ckpt")["micro_batch"] == 4
    plain = lm.run_config(lm.parse_args(["--device", "cpu"]), "ddp", tmp_path, tmp_path / "ckpt")
    assert "micro_batch" not in plain
    argv = [
        "--device",
        "cpu",
        "--per-gpu-batch",
        "16",
        "--micro-batch",
        "6",
        "--out",
        str(tmp_path / "x.csv"),
    ]
    assert lm.main(argv) == EXIT_BAD_CONFIG
    assert "micro_batch=6 does not divide per_gpu_batch=16" in capsys.readouterr().err
    assert not (tmp_path / "x.csv").exists()
    with pytest.raises(SystemExit):
        lm.parse_args(["--micro-batch", "0"])
    assert "--micro-batch must be at least 1" in capsys.readouterr().err
