"""Every step variant keeps the CPU resume bit-exact (issue 42): a run of each optimizer kernel
(train.optimizer_impl: auto, fused, foreach, forloop; SGD and AdamW) and of a compile mode, stopped
twice by SIGTERM mid-epoch (checkpoint, exit 75) and resumed, ends with the uninterrupted run's
weights and optimizer state, bit for bit. Tiny: ResNet-18 at width 8, 2 epochs of 4 steps, in
deterministic mode, in this process (as tests/test_train.py does its resume tests)."""

from __future__ import annotations

import json

import pytest
import torch

from scalestudy import contract
from scalestudy.train.checkpoint import single_file as checkpoint
from tests.inprocess import SignalAtStep, one_process_one_thread, write_packed_cifar  # noqa: F401
from tests.run_configs import resnet_run
from tests.trainer_runs import main

BASE = resnet_run(
    epochs=2,
    max_steps_per_epoch=4,
    eval_max_batches=1,
    checkpoint_every_steps=0,
    log_every_steps=1,  # the step lines the signal is sent on
    step_timing_every=0,
    measure_warmup_steps=1,
    measure_steps=2,
    measure_intervals=1,
)
STOPS = (2, 5)  # global steps: mid epoch 1, mid epoch 2
VARIANTS = {
    "sgd-auto": {"optimizer": "sgd", "optimizer_impl": "auto"},
    "sgd-fused": {"optimizer": "sgd", "optimizer_impl": "fused"},
    "sgd-foreach": {"optimizer": "sgd", "optimizer_impl": "foreach"},
    "sgd-forloop": {"optimizer": "sgd", "optimizer_impl": "forloop"},
    "adamw-fused": {"optimizer": "adamw", "optimizer_impl": "fused", "lr": 0.001},
    "adamw-foreach": {"optimizer": "adamw", "optimizer_impl": "foreach", "lr": 0.001},
    "adamw-forloop": {"optimizer": "adamw", "optimizer_impl": "forloop", "lr": 0.001},
}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return write_packed_cifar(tmp_path_factory.mktemp("packed"), 16, 4)


def _final(folder) -> dict:
    return checkpoint.load_latest(folder / "ckpt")[0]


def _flat(state, prefix: str = "") -> dict[str, object]:
    """Every leaf of a (nested) state dict by its path."""
    if isinstance(state, dict):
        return {k: v for key, value in state.items() for k, v in _flat(value, f"{prefix}{key}/").items()}
    if isinstance(state, list | tuple):
        return {k: v for i, value in enumerate(state) for k, v in _flat(value, f"{prefix}{i}/").items()}
    return {prefix: state}


def _assert_bit_identical(got: dict, want: dict, what: str) -> None:
    got, want = _flat(got), _flat(want)
    assert got.keys() == want.keys(), what
    for key, value in want.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(got[key], value) and got[key].dtype == value.dtype, f"{what}: {key} differs"
        else:
            assert got[key] == value, f"{what}: {key}: {got[key]!r} != {value!r}"


def _run_and_resume(tmp_path, data_dir, changes: dict) -> tuple[dict, dict]:
    """(the uninterrupted run's last checkpoint, the twice-stopped and resumed run's)."""
    finals = []
    for name, stops in (("straight", ()), ("stopped", STOPS)):
        folder = tmp_path / name
        config = {**BASE, "data_dir": str(data_dir), "checkpoint_dir": str(folder / "ckpt"), **changes}
        for stop in stops:
            with SignalAtStep(stop):
                assert main(folder / "run", config) == contract.EXIT_RESUMABLE
            assert _final(folder)["position"]["global_step"] == stop
        assert main(folder / "run", config) == 0
        finals.append(_final(folder))
    straight, stopped = finals
    summary = json.loads((tmp_path / "stopped/run/summary.json").read_text())["results"]
    assert summary["resumes"] == list(STOPS)
    return straight, stopped


@pytest.mark.parametrize("variant", VARIANTS)
def test_each_optimizer_kernel_resumes_to_the_uninterrupted_runs_bits(tmp_path, data_dir, variant):
    straight, stopped = _run_and_resume(tmp_path, data_dir, VARIANTS[variant])
    _assert_bit_identical(stopped["model"], straight["model"], f"{variant} weights")
    _assert_bit_identical(stopped["optimizer"], straight["optimizer"], f"{variant} optimizer state")
    assert straight["optimizer"]["state"], "the optimizer kept no state: nothing was compared"


def test_a_compile_mode_resumes_to_the_uninterrupted_runs_bits(tmp_path, data_dir, compile_modes):
    """compile_mode is part of the run config the checkpoint belongs to: a compiled run resumes (not
    refused as another run's checkpoint), compiled again in its mode (recorded, the model run eager)."""
    changes = {"optimizer_impl": "foreach", "compile": True, "compile_mode": "max-autotune-no-cudagraphs"}
    straight, stopped = _run_and_resume(tmp_path, data_dir, changes)
    assert compile_modes == ["max-autotune-no-cudagraphs"] * (1 + len(STOPS) + 1)
    _assert_bit_identical(stopped["model"], straight["model"], "compiled weights")
    _assert_bit_identical(stopped["optimizer"], straight["optimizer"], "compiled optimizer state")
