"""A training job's fixed cost (issue 51): before its first step a job runs no forward on its own
device (the FLOP count runs on the `meta` device) and imports no torchvision (the network is written
out in the package; the batch check reads the data's files), as an import-time probe around a real
trainer process shows; its start-up parts are in summary.json (runs.csv's startup_parts_s.*). The
bf16 probe is a matmul (no cuDNN in a job without convolutions) and cuDNN's autotuning is bounded."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from scalestudy.train import process
from tests.processes import child_env
from tests.trainer_runs import REPO, run_maker

# The trainer's own command line (program.run_as_program) with a probe in front: every import of
# torchvision, every forward of the ResNet (its device and batch) and every start-up mark, in order,
# one JSON line each, written as it happens (the trainer ends with os._exit: no atexit).
PROBE = """
import json, os, sys, time
sys.path.insert(0, {repo!r})
out = open(os.environ["PROBE_OUT"], "a", buffering=1)
def event(*fields):
    out.write(json.dumps([*fields, time.time()]) + "\\n")
class Imports:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "torchvision":
            event("import", name)
        return None
sys.meta_path.insert(0, Imports())
import torch
def forward(module, args):
    if type(module).__name__ == "CifarResNet":
        event("forward", args[0].device.type, args[0].shape[0])
torch.nn.modules.module.register_module_forward_pre_hook(forward)
from scalestudy.train import program, startup
marked = startup.mark
def mark(stage, at=None):
    event("mark", stage)
    marked(stage, at)
startup.mark = mark
program.run_as_program()
"""


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    """(the probe's events, summary.json's results) of a one-epoch eager CPU run of 3 steps."""
    folder = tmp_path_factory.mktemp("probe")
    script, events = folder / "probe.py", folder / "events.jsonl"
    script.write_text(PROBE.format(repo=str(REPO)))
    out, _, config = run_maker(tmp_path_factory)(
        "probed", epochs=1, max_steps_per_epoch=3, measure_steps=1, measure_intervals=1
    )
    command = [sys.executable, str(script), "--run-config-json", json.dumps(config), "--out-dir", str(out)]
    env = child_env(PROBE_OUT=str(events))
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [json.loads(line) for line in events.read_text().splitlines()]
    return lines, json.loads((out / "summary.json").read_text())["results"]


def test_before_its_first_step_a_job_runs_no_forward_on_its_device_and_imports_no_torchvision(probed):
    events, results = probed
    marks = [event[1] for event in events if event[0] == "mark"]
    assert marks[:8] == ["imports", "config", "settings", "process_group", "data", "model", "setup", "resume"]
    before = events[: next(i for i, e in enumerate(events) if e[:2] == ["mark", "resume"])]
    forwards = [event[1:3] for event in before if event[0] == "forward"]
    assert forwards == [["meta", 1]]  # the FLOP count, shapes only
    after = [event[1:3] for event in events[len(before) :] if event[0] == "forward"]
    assert after[0] == ["cpu", results["per_gpu_batch"]]  # the probe sees the steps: the first is one
    assert not [event for event in events if event[0] == "import"]  # torchvision: never, in the whole run
    assert results["forward_flops_per_image"] > 0


def test_the_start_up_parts_are_reported_and_add_up(probed):
    _, results = probed
    parts = results["startup_parts_s"]
    assert {"imports_s", "config_s", "model_s", "setup_s", "resume_s", "first_step_s"} <= set(parts)
    assert sum(parts.values()) == pytest.approx(results["startup_s"])


def test_the_precision_probe_is_a_matmul_and_cudnns_autotuning_is_bounded(monkeypatch):
    """autocast_dtype tries a matmul in the dtype: no convolution (cuDNN) for a job that has none."""
    convolutions = []
    monkeypatch.setattr(torch.nn.functional, "conv2d", lambda *a, **k: convolutions.append(a))
    assert process.autocast_dtype("bf16", torch.device("cpu")) == torch.bfloat16 and not convolutions
    run = {"precision": "fp32", "deterministic": False, "seed": 0, "cudnn_benchmark_limit": 3}
    before = torch.backends.cudnn.benchmark_limit
    with process.process_settings(run):
        assert torch.backends.cudnn.benchmark_limit == 3 and torch.backends.cudnn.benchmark
    assert torch.backends.cudnn.benchmark_limit == before
