"""The GPU step path's torch-dependent options, checked against the installed torch on the CPU."""

import os

import pytest

from scalestudy.train import torch_options as torchopts


def test_ddp_options_take_what_the_installed_torch_offers(monkeypatch):
    options = torchopts.ddp_options(compiled=False)
    assert options["gradient_as_bucket_view"] and options["static_graph"]
    assert options["forward_sync_buffers"] is False and options["batched_grad_copy"] is True  # torch 2.14
    assert torchopts.ddp_options(compiled=True)["static_graph"] is False

    class OlderDDP:  # torch < 2.13: neither forward_sync_buffers nor batched_grad_copy
        def __init__(self, module, broadcast_buffers=True, static_graph=False, gradient_as_bucket_view=False):
            pass

    monkeypatch.setattr(torchopts, "DistributedDataParallel", OlderDDP)
    older = torchopts.ddp_options(compiled=False)
    assert older == {"gradient_as_bucket_view": True, "static_graph": True, "broadcast_buffers": False}


def test_the_inductor_cache_goes_where_the_run_config_says_unless_the_environment_does(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    for before in (None, torchopts.torch_default_inductor_cache()):  # torch's import sets its default
        if before is None:
            monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
        else:
            monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", before)
        torchopts.use_inductor_cache("results/inductor-cache")
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "results" / "inductor-cache")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/site/cache")
    torchopts.use_inductor_cache("results/inductor-cache")
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/site/cache"


def test_compile_seconds_add_the_frames_and_the_backward_graphs(monkeypatch):
    from torch._dynamo import utils

    timings = {"_compile.compile_inner": [2.0, 0.5], "backward._backward_impl": [1.0]}
    timings["GraphLowering.run"] = [9.0]  # inside compile_inner: not counted twice
    monkeypatch.setattr(utils, "compilation_time_metrics", timings)
    assert torchopts.compile_seconds() == pytest.approx(3.5)


def test_compiled_runs_log_graph_breaks_and_recompiles_unless_torch_logs_is_set(monkeypatch):
    import torch._logging

    settings = []
    monkeypatch.setattr(torch._logging, "set_logs", lambda **kwargs: settings.append(kwargs))
    monkeypatch.delenv("TORCH_LOGS", raising=False)
    torchopts.log_graph_breaks()
    assert settings == [{"graph_breaks": True, "recompiles": True}]
    monkeypatch.setenv("TORCH_LOGS", "+dynamo")
    torchopts.log_graph_breaks()
    assert len(settings) == 1  # the environment's choice stands
