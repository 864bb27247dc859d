"""The step's model and loss as one compiled region (scalestudy.train.model_loss, issue 51): at one rank
and under DDP the trainer compiles the model with its loss, so the loss's fp32 upcast of the logits is
inside the graph (no fp32 copy of the [tokens, vocab] logits outside it), and the compiled step trains
the same weights as the eager one. On the CPU without Inductor's C++ build (minutes cold): Dynamo's
graph with a recording backend, and the training with AOTAutograd's joint graph under Inductor's
decompositions and partitioner (`aot_eager_decomp_partition`), what Inductor generates code from."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from scalestudy.train import build, optim
from scalestudy.train import torch_options as torchopts
from scalestudy.train.build import MixedPrecision
from scalestudy.train.model_loss import ModelAndLoss
from scalestudy.train.optimizer_step import OptimizerStep, StepSettings
from scalestudy.train.parallel import ParallelSettings
from scalestudy.train.state import StepTimer
from scalestudy.workloads.gpt.model import GPT, GPTConfig

CPU = torch.device("cpu")
CFG = GPTConfig(vocab_size=64, seq_len=16, layers=2, heads=2, d_model=32)
SETTINGS = {
    "workload": "gpt",
    "parallelism": "ddp",
    "precision": "fp32",
    "comm_hook": "none",
    "bucket_cap_mb": 25,
    "reshard_after_forward": True,
    "compile_mode": "default",
    "deterministic": False,
    "micro_batch": None,
}


@pytest.fixture
def dynamo(monkeypatch):
    """torch.compile with `backend` (a name or a callable) in place of Inductor, Dynamo's state reset
    before and after; yields a function that sets the backend."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    real, chosen = torch.compile, {}

    def compile_with(model=None, **options):
        return real(model, fullgraph=options.get("fullgraph", False), backend=chosen["backend"])

    monkeypatch.setattr(torch, "compile", compile_with)
    monkeypatch.setattr(torchopts, "log_graph_breaks", lambda: None)
    torch._dynamo.reset()
    counters.clear()
    yield lambda backend: chosen.update(backend=backend)
    torch._dynamo.reset()
    counters.clear()


def _prepared(compile: bool, label_smoothing: float = 0.0):
    torch.manual_seed(0)
    model = GPT(CFG)
    settings = ParallelSettings.from_config({**SETTINGS, "compile": compile})
    blocks = list(model.blocks)
    wrapped, step_module = build.prepare_model(model, settings, CPU, 1, blocks, label_smoothing)
    return model, wrapped, step_module


def test_one_rank_compiles_the_model_and_its_loss_as_one_graph(dynamo):
    graphs = []
    dynamo(lambda gm, inputs: graphs.append(gm) or gm.forward)
    model, wrapped, step_module = _prepared(compile=True)
    assert isinstance(wrapped.step, ModelAndLoss) and wrapped.step.model is model
    x, y = torch.randint(0, 64, (2, 16)), torch.randint(0, 64, (2, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the GPU run's bf16 autocast, on the CPU
        logits, loss = step_module(x, y)
    assert len(graphs) == 1 and torchopts.graph_breaks() == 0
    calls = [node.target for node in graphs[0].graph.nodes if node.op in ("call_function", "call_method")]
    assert F.cross_entropy in calls and "float" in calls  # the upcast and the loss, inside the graph
    assert calls.index("float") > max(i for i, target in enumerate(calls) if target is F.linear)  # the head's
    assert logits.dtype == torch.bfloat16 and loss.dtype == torch.float32  # no fp32 logits leave it
    assert loss.item() == pytest.approx(F.cross_entropy(logits.flatten(0, 1).float(), y.flatten()).item())


def _train(step_module, model, steps: int = 4) -> list[float]:
    """`steps` AdamW steps of the trainer's OptimizerStep (fused, as on the GPU); their losses."""
    adamw = optim.OptimizerSettings("adamw", "auto", 0.1, 0.9, False)
    optimizer = optim.build_optimizer(model, adamw, 3e-3, sharded=False)
    assert optimizer.defaults["fused"]  # the trainer's AdamW stays fused beside the compiled step
    scheduler = optim.build_scheduler(optimizer, warmup_steps=1, total_steps=steps)
    precision = MixedPrecision(None, False, torch.amp.GradScaler("cpu", enabled=False), "cpu")
    settings = StepSettings(micro_batch=None, grad_clip=1.0)
    step = OptimizerStep(settings, model, step_module, step_module, optimizer, scheduler, precision)
    generator, losses = torch.Generator().manual_seed(1), []
    for _ in range(steps):
        x, y = (torch.randint(0, 64, (4, 16), generator=generator) for _ in range(2))
        _, loss = step.forward_backward(x, y, StepTimer(CPU, enabled=False), lambda: None)
        step.update()
        losses.append(loss.item())
    return losses


def test_the_compiled_step_trains_the_eager_steps_weights(dynamo):
    dynamo("aot_eager_decomp_partition")
    eager_model, _, eager_step = _prepared(compile=False, label_smoothing=0.1)
    compiled_model, _, compiled_step = _prepared(compile=True, label_smoothing=0.1)
    assert compiled_step is not compiled_model
    eager_losses, compiled_losses = _train(eager_step, eager_model), _train(compiled_step, compiled_model)
    assert compiled_losses == pytest.approx(eager_losses, rel=1e-5)
    assert eager_losses[-1] < eager_losses[0]  # it trained
    start = _prepared(compile=False)[0].state_dict()
    moved_apart = _moved_apart(compiled_model.state_dict(), eager_model.state_dict(), start)
    assert moved_apart < 1e-4  # the tolerance of tests/test_lm.py's FSDP2 vs DDP


def _moved_apart(a: dict, b: dict, start: dict) -> float:
    """|a - b| over how far `b` moved from `start`, all weights as one vector (AdamW's normalised steps
    make a single near-zero gradient's rounding visible element by element)."""
    flat = [torch.cat([t[k].flatten().double() for k in sorted(t)]) for t in (a, b, start)]
    return float((flat[0] - flat[1]).norm() / (flat[1] - flat[2]).norm())
