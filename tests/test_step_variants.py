"""The step variants the GPU benchmark compares (scalestudy.benchmark.variants) train the same model on
the CPU: the optimizer's kernels (train.optimizer_impl: fused, foreach, for-loop) give the default's
weights within float rounding, and train.compile_mode reaches torch.compile (the DDP module's and
FSDP2's per-block compile)."""

from __future__ import annotations

import pytest
import torch

from scalestudy.plan import runconfig
from scalestudy.train import optim
from scalestudy.train.checkpoint import single_file as checkpoint
from tests.inprocess import one_process_one_thread, write_packed_cifar  # noqa: F401
from tests.run_configs import resnet_run
from tests.trainer_runs import main

BASE = resnet_run(
    epochs=1,
    max_steps_per_epoch=8,
    checkpoint_every_steps=0,
    log_every_steps=0,
    measure_warmup_steps=2,
    measure_steps=4,
    measure_intervals=2,
)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """name -> the final weights of BASE + changes, trained once per name."""
    data = write_packed_cifar(tmp_path_factory.mktemp("packed"), 16, 4)
    root = tmp_path_factory.mktemp("runs")
    done: dict[str, dict] = {}

    def run(name: str, **changes) -> dict:
        if name not in done:
            folder = root / name
            config = {**BASE, "data_dir": str(data), "checkpoint_dir": str(folder / "ckpt"), **changes}
            assert main(folder / "run", config) == 0
            done[name] = checkpoint.load_latest(folder / "ckpt")[0]["model"]
        return done[name]

    return run


@pytest.mark.parametrize("impl", ["foreach", "forloop", "fused"])
def test_each_optimizer_kernel_trains_the_defaults_weights(trained, impl):
    default = trained("default")
    variant = trained(impl, optimizer_impl=impl)
    assert default.keys() == variant.keys()
    for key, tensor in default.items():
        if tensor.is_floating_point():
            torch.testing.assert_close(variant[key], tensor, rtol=1e-5, atol=1e-6, msg=key)
        else:
            assert torch.equal(variant[key], tensor), key


@pytest.mark.parametrize("name", ["sgd", "adamw"])
@pytest.mark.parametrize("impl", ["fused", "foreach", "forloop"])
def test_the_optimizer_kernels_compute_the_same_update(name, impl):
    """Five steps of each optimizer on the same gradients against the for-loop's (the reference
    arithmetic): foreach does the same operations, bit for bit; the fused kernel within rounding."""

    def steps(config: dict) -> list[torch.Tensor]:
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.LayerNorm(5), torch.nn.Linear(5, 3))
        opt = optim.build_optimizer(net, settings(config), peak_lr=0.01, sharded=False)
        for step in range(5):
            generator = torch.Generator().manual_seed(step)
            loss = net(torch.randn(4, 7, generator=generator)).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return [p.detach().clone() for p in net.parameters()]

    common = {"optimizer": name, "momentum": 0.9, "nesterov": True, "weight_decay": 5e-4}
    reference = steps({**common, "optimizer_impl": "forloop"})
    for got, want in zip(steps({**common, "optimizer_impl": impl}), reference, strict=True):
        if impl == "fused":
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
        else:
            assert torch.equal(got, want)


def settings(config: dict) -> optim.OptimizerSettings:
    return optim.OptimizerSettings.from_config(config)


def test_auto_is_fused_except_sgd_over_dtensors():
    assert optim.implementation(settings({"optimizer": "sgd"}), sharded=False) == {"fused": True}
    assert optim.implementation(settings({"optimizer": "sgd"}), sharded=True) == {"foreach": True}
    assert optim.implementation(settings({"optimizer": "adamw"}), sharded=True) == {"fused": True}
    assert optim.implementation(settings({"optimizer_impl": "forloop"}), sharded=False) == {"foreach": False}


def test_fused_sgd_over_dtensors_is_refused_in_one_line():
    with pytest.raises(runconfig.RunConfigError, match="optimizer_impl='fused' with sgd over FSDP2"):
        optim.implementation(settings({"optimizer": "sgd", "optimizer_impl": "fused"}), sharded=True)
    adamw = settings({"optimizer": "adamw", "optimizer_impl": "fused"})
    assert optim.implementation(adamw, sharded=True) == {"fused": True}


def test_a_bad_variant_is_refused_naming_its_key():
    config = {**runconfig.DEFAULTS, **BASE, "data_dir": "d", "checkpoint_dir": "c"}
    for key, value in (("optimizer_impl", "apex"), ("compile_mode", "fast")):
        with pytest.raises(runconfig.RunConfigError, match=f"{key}='{value}' must be one of"):
            runconfig.validate({**config, key: value})


def test_the_compile_mode_reaches_torch_compile(trained, compile_modes):
    """torch.compile is handed the run config's mode (recorded, then the model runs eager)."""
    eager = trained("default")
    weights = trained("compile-ro", compile=True, compile_mode="reduce-overhead")
    assert compile_modes == ["reduce-overhead"]
    for key, tensor in eager.items():
        assert torch.equal(weights[key], tensor), key
