"""The GPU step path's mechanisms that a CPU can show (issue 24): the one-rank FSDP2 group serves the
stop agreement's CPU tensors, fp32 is IEEE fp32, FSDP2's root (and at one rank every block) keeps
its parameters and only the root casts the inputs, an FSDP2 fp16
step issues no host sync, blocks are compiled before they are sharded, `deterministic` is refused
up front where CUDA has no deterministic kernel, and FSDP2 runs get expandable segments. What only a
GPU can confirm is listed in docs/reference/verification.md ("What only a GPU can confirm")."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

from scalestudy.plan.runconfig import RunConfigError
from scalestudy.train import optim, parallel, process
from scalestudy.train import torch_options as torchopts
from scalestudy.train.parallel import ParallelSettings
from scalestudy.train.state import StopRequest
from scalestudy.workloads.gpt.model import GPT, GPTConfig
from tests.op_log import OpLog

HOST_SYNC_OPS = {"aten::_local_scalar_dense", "aten::item"}


@pytest.fixture
def group():
    """Destroys whatever one-rank process group the test made."""
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def run_config(**overrides) -> dict:
    return {
        "workload": "gpt",
        "parallelism": "fsdp",
        "precision": "fp32",
        "reshard_after_forward": True,
        "compile": False,
        "compile_mode": "default",
        "comm_hook": "none",
        "deterministic": False,
        "seed": 0,
        "optimizer": None,
        "weight_decay": 0.1,
        **overrides,
    }


def tiny_gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=64, seq_len=16, layers=2, heads=2, d_model=32))


# --- 1. the one-rank group and the stop agreement ----------------------------------------------------


def _agree_until_stopped(stop: StopRequest) -> list[bool]:
    answers = [stop.agreed(None), stop.agreed(None)]
    stop.signum = 15  # SIGTERM arrives: the next agreement starts with the flag, the one after stops
    answers += [stop.agreed(None), stop.agreed(None)]
    stop.drain()
    return answers


def test_a_group_whose_backend_serves_only_cuda_cannot_run_the_stop_agreement(group):
    """The mechanism of the crash: NCCL serves `cuda` only; `cuda:gloo` is the same on a CPU."""
    dist.init_process_group("cuda:gloo", store=dist.HashStore(), rank=0, world_size=1)
    with pytest.raises(RuntimeError, match="No backend type associated with device type cpu"):
        _agree_until_stopped(StopRequest())


def test_the_one_rank_group_serves_cpu_tensors_too(group):
    """init_single_rank_group, the trainer's code path for FSDP2 at one rank, given the same
    CUDA-only backend: gloo is added for the CPU, and the agreement and object collectives run."""
    assert parallel.single_rank_backend("nccl") == "cpu:gloo,cuda:nccl"
    assert parallel.single_rank_backend("cuda:gloo") == "cpu:gloo,cuda:gloo"
    assert parallel.single_rank_backend("gloo") == "gloo"
    parallel.init_single_rank_group("cuda:gloo")
    assert _agree_until_stopped(StopRequest()) == [False, False, False, True]
    gathered = [None]
    dist.all_gather_object(gathered, {"rank": 0})
    assert gathered == [{"rank": 0}]


# --- 5. fp32 is IEEE fp32; tf32 is its own precision ----------------------------------------------------


@pytest.mark.parametrize(
    ("precision", "math"), [("fp32", "ieee"), ("tf32", "tf32"), ("bf16", "ieee"), ("fp16", "ieee")]
)
def test_precision_sets_the_fp32_math_of_cudnn_and_cublas_and_restores_it(precision, math):
    before = process.fp32_math()
    assert before["cudnn_conv"] == "tf32"  # torch 2.14's default: the bias this fixes
    with process.process_settings(run_config(precision=precision, parallelism="ddp")):
        assert process.fp32_math() == {"cudnn_conv": math, "cudnn_rnn": math, "cuda_matmul": math}
    assert process.fp32_math() == before


@pytest.mark.parametrize(("precision", "math"), [("tf32", "tf32")])  # fp32: tests/test_train.py
def test_a_run_records_its_fp32_math_and_precision_in_the_summary(tmp_path, monkeypatch, precision, math):
    """A two-step CPU run of the trainer: provenance.fp32_math says how fp32 ran, per precision."""
    import json

    import numpy as np

    from scalestudy.data.synthetic_cifar import generate_arrays
    from scalestudy.train import program

    for key in [k for k in os.environ if k.startswith(("SLURM_", "RANK", "WORLD_SIZE", "LOCAL_RANK"))]:
        monkeypatch.delenv(key)
    arrays = generate_arrays(2, 1, seed=0)
    for name, array in zip(
        ("train_images", "train_labels", "test_images", "test_labels"), arrays, strict=True
    ):
        np.save(tmp_path / f"{name}.npy", array)
    config = {
        "world_size": 1,
        "per_gpu_batch": 8,
        "global_batch": 8,
        "base_batch": 8,
        "epochs": 1,
        "width": 4,
        "max_steps_per_epoch": 2,
        "precision": precision,
        "data_dir": str(tmp_path),
        "checkpoint_dir": str(tmp_path / "ckpt"),
    }
    out = tmp_path / "run"
    argv = ["--run-config-json", json.dumps(config), "--out-dir", str(out), "--log-level", "WARNING"]
    assert program.main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["provenance"]["fp32_math"] == {"cudnn_conv": math, "cudnn_rnn": math, "cuda_matmul": math}
    assert summary["results"]["precision_effective"] == precision
    assert process.fp32_math()["cudnn_conv"] == "tf32"  # torch's default again after the run


def test_the_precision_that_ran_is_recorded_as_such():
    assert process.effective_precision("tf32", None) == "tf32"
    assert process.effective_precision("fp32", None) == "fp32"
    assert process.effective_precision("bf16", torch.bfloat16) == "bf16"
    assert process.effective_precision("bf16", None) == "fp32"  # autocast could not run it


# --- 6 and 8. FSDP2's arguments and the compile order ----------------------------------------------------


def _recorded_fully_shard(monkeypatch) -> list[tuple[torch.nn.Module, dict, bool]]:
    """Every fully_shard call: (module, its keyword arguments, whether the module was compiled)."""
    import torch.distributed.fsdp as fsdp

    calls, real = [], fsdp.fully_shard

    def recording(module, **kwargs):
        calls.append((module, kwargs, module._compiled_call_impl is not None))
        return real(module, **kwargs)

    monkeypatch.setattr(fsdp, "fully_shard", recording)
    return calls


def test_at_one_rank_no_module_reshards_and_only_the_root_casts_inputs(group, monkeypatch):
    """train.reshard_after_forward true (the schema's default) asks the blocks to reshard; at one rank
    they keep their parameters (nothing is gathered; resharding would cast and copy them twice a
    step), and the root never reshards. The forward inputs are cast once, by the root."""
    parallel.init_single_rank_group("gloo")
    calls = _recorded_fully_shard(monkeypatch)
    net = tiny_gpt()
    settings = ParallelSettings.from_config(run_config(precision="bf16"))
    assert settings.reshard_after_forward is True
    wrapped = parallel.wrap(net, settings, torch.device("cpu"), 1, list(net.blocks))
    assert [module for module, _, _ in calls] == [*net.blocks, net]
    assert [kwargs["reshard_after_forward"] for _, kwargs, _ in calls] == [False, False, False]
    x = torch.randint(0, 64, (2, 16))
    logits, loss = wrapped.step(x, x)
    assert logits.dtype == torch.bfloat16 and loss.dtype == torch.float32  # the loss upcasts
    loss.backward()  # lazy init decided the root
    for module in (net, *net.blocks):
        assert module._get_fsdp_state()._fsdp_param_group.post_forward_mesh_info is None  # no reshard
    assert net._get_fsdp_state()._mp_policy.cast_forward_inputs
    assert not any(block._get_fsdp_state()._mp_policy.cast_forward_inputs for block in net.blocks)
    assert wrapped.module is net and wrapped.step.model is net  # evaluation calls the root itself
    assert wrapped.options["reshard_after_forward"] is False
    assert wrapped.options["root_reshard_after_forward"] is False and not wrapped.compiled


@pytest.fixture
def eager_compile(monkeypatch):
    """torch.compile with the eager backend (Dynamo's graph capture without Inductor's C++ build):
    graph breaks and frames are Dynamo's, the same as under Inductor."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    real = torch.compile  # nn.Module.compile calls it too

    def eager(model=None, **options):
        return real(model, fullgraph=options.get("fullgraph", False), backend="eager")

    monkeypatch.setattr(torch, "compile", eager)
    monkeypatch.setenv("TORCH_LOGS", "")  # log_graph_breaks may switch the logs on; not in tests
    monkeypatch.setattr(torchopts, "log_graph_breaks", lambda: None)
    torch._dynamo.reset()
    counters.clear()
    yield counters
    torch._dynamo.reset()
    counters.clear()


def test_blocks_are_compiled_before_they_are_sharded_and_nothing_graph_breaks(
    group, monkeypatch, eager_compile
):
    parallel.init_single_rank_group("gloo")
    calls = _recorded_fully_shard(monkeypatch)
    net = tiny_gpt()
    wrapped = parallel.wrap(
        net, ParallelSettings.from_config(run_config(compile=True)), torch.device("cpu"), 1, list(net.blocks)
    )
    assert [(module, compiled) for module, _, compiled in calls] == [
        (net.blocks[0], True),
        (net.blocks[1], True),
        (net, False),  # the root (embeddings, head) is not compiled
    ]
    assert wrapped.compiled and wrapped.options["compiled_units"] == 2
    assert wrapped.step.loss_compiled and wrapped.options["compiled_loss"]  # the loss on its own
    assert set(net.state_dict()) == set(tiny_gpt().state_dict())  # in place: the checkpoints' keys
    for _ in range(2):
        x = torch.randint(0, 64, (2, 16))
        wrapped.step(x, x)[1].backward()
    assert torchopts.graph_breaks() == 0
    # one graph for every block and one for the loss, no recompiles
    assert eager_compile["stats"]["unique_graphs"] == 2


def test_compiling_the_whole_model_after_fully_shard_graph_breaks(group, eager_compile):
    """The order this replaces: FSDP2's dynamo-disabled hooks break the root's graph."""
    parallel.init_single_rank_group("gloo")
    net = tiny_gpt()
    wrapped = parallel.wrap(
        net, ParallelSettings.from_config(run_config()), torch.device("cpu"), 1, list(net.blocks)
    )
    compiled = torch.compile(wrapped.module, backend="eager")
    compiled(torch.randint(0, 64, (2, 16))).sum().backward()
    assert torchopts.graph_breaks() > 0


# --- 7. no host sync in an FSDP2 fp16 step --------------------------------------------------------


def _fp16_fsdp_step_syncs(make_optimizer) -> int:
    """Host syncs of the third step of the trainer's step (Trainer.train_epoch: scaled backward,
    unscale + clip, scaler.step, update, zero_grad, scheduler) on an FSDP2 fp16 model."""
    config = run_config(precision="fp16", optimizer="adamw")
    net = tiny_gpt()
    wrapped = parallel.wrap(
        net, ParallelSettings.from_config(config), torch.device("cpu"), 1, list(net.blocks)
    )
    optimizer = make_optimizer(net, config)
    scheduler = optim.build_scheduler(optimizer, 1, 10)
    scaler = torch.amp.GradScaler("cpu", enabled=True)
    x, y = torch.randint(0, 64, (2, 16)), torch.randint(0, 64, (2, 16))
    for _ in range(3):
        with OpLog() as log:
            logits = wrapped.module(x)
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, -2).float(), y.flatten())
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
    return sum(op in HOST_SYNC_OPS for op in log.ops)


def test_an_fsdp2_fp16_step_issues_no_host_sync(group):
    parallel.init_single_rank_group("gloo")
    settings = optim.OptimizerSettings.from_config(run_config(optimizer="adamw"))
    optimizer = optim.build_optimizer(tiny_gpt(), settings, 1e-3, sharded=True)
    assert optimizer.defaults["fused"] and not optimizer.defaults["foreach"]

    def make(net, config):
        return optim.build_optimizer(net, optim.OptimizerSettings.from_config(config), 1e-3, sharded=True)

    assert _fp16_fsdp_step_syncs(make) == 0


def test_the_foreach_optimizer_it_replaces_syncs_every_fp16_step(group):
    """The control: the count sees GradScaler's `.item()` of the non-fused path."""
    parallel.init_single_rank_group("gloo")
    syncs = _fp16_fsdp_step_syncs(lambda net, c: torch.optim.AdamW(net.parameters(), lr=1e-3, foreach=True))
    assert syncs >= 1


# --- 9. deterministic on CUDA, expandable segments -------------------------------------------------


def test_deterministic_resnet_on_cuda_is_refused_up_front_with_the_reason():
    from scalestudy.workloads.resnet_cifar.model import build_model

    model = build_model(width=8)
    config = run_config(workload="resnet18-cifar10", parallelism="ddp", deterministic=True)
    with pytest.raises(RunConfigError, match="AdaptiveAvgPool2d has no deterministic kernel"):
        parallel.wrap(
            model, ParallelSettings.from_config(config), torch.device("cuda", 0), 2, []
        )  # before DDP touches a device
    process.check_deterministic(model, config, torch.device("cpu"))  # the CPU has the kernels
    process.check_deterministic(model, {**config, "deterministic": False}, torch.device("cuda", 0))
    process.check_deterministic(tiny_gpt(), config, torch.device("cuda", 0))  # no such module


@pytest.mark.parametrize(("parallelism", "expected"), [("fsdp", process.FSDP_ALLOC_CONF), ("ddp", None)])
def test_fsdp2_runs_get_expandable_segments_unless_the_environment_says_otherwise(
    monkeypatch, parallelism, expected
):
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    with process.process_settings(run_config(parallelism=parallelism)):
        assert os.environ.get("PYTORCH_CUDA_ALLOC_CONF") == expected
    assert "PYTORCH_CUDA_ALLOC_CONF" not in os.environ
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:512")
    with process.process_settings(run_config(parallelism=parallelism)):
        assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:512"


def test_the_allocator_settings_go_through_torchs_current_setter_not_the_deprecated_one(monkeypatch):
    """Where CUDA has started, the settings are set at once too; the deprecated setter warned in
    every FSDP2 run on the H100 (FutureWarning, torch 2.11)."""
    import warnings

    calls = []
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch._C, "_accelerator_setAllocatorSettings", calls.append)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        process.use_expandable_segments()
    assert calls == [process.FSDP_ALLOC_CONF]


# --- 4. no synchronising (sampled) step inside the profile window --------------------------------


@pytest.mark.parametrize(
    ("measuring", "profiling", "sampled"), [(False, False, True), (True, False, False), (False, True, False)]
)
def test_a_timed_step_never_falls_inside_the_profile_window(measuring, profiling, sampled):
    """profiling.start_step on a step_timing_every step would make the first profiled step a
    synchronising one (StepTimer syncs at every phase)."""
    from types import SimpleNamespace

    from scalestudy.train.trainer import Trainer

    trainer = SimpleNamespace(
        state=SimpleNamespace(position=SimpleNamespace(global_step=8)),
        config={"step_timing_every": 4},
        steady=SimpleNamespace(measuring=measuring),
        window=SimpleNamespace(active=profiling),
    )
    assert Trainer.times_this_step(trainer) is sampled
