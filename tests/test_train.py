"""The trainer end to end on CPU: run folder, profiling window, precisions, learning, resume after
SIGTERM/SIGUSR1/SIGKILL, and DDP over gloo with real processes (torchrun, and srun-style variables).

Runs use ResNet-18 at width 8 on 320 synthetic training images (batch 16, 12 steps per epoch) in
deterministic mode, so that an interrupted and resumed run can be compared bit for bit with an
uninterrupted one. Single-rank runs call program.main() in this process (no 4 s torch import);
that gives the same bits as a subprocess, since both run with one thread.
"""

import json
import logging
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from scalestudy import provenance
from scalestudy.data.synthetic_cifar import generate_arrays
from scalestudy.launch import distributed
from scalestudy.plan import runconfig
from scalestudy.plan.runfiles import METRICS_COLUMNS
from scalestudy.train import program
from scalestudy.train import trainer as train
from scalestudy.train.checkpoint import policy
from scalestudy.train.checkpoint import single_file as checkpoint
from scalestudy.train.parallel import COMM_HOOKS
from scalestudy.train.process import seed_everything
from scalestudy.workloads.resnet_cifar import model

REPO = Path(__file__).resolve().parent.parent
BASE = {
    "world_size": 1,
    "per_gpu_batch": 16,
    "global_batch": 16,
    "base_batch": 16,
    "epochs": 2,
    "width": 8,
    # what these tests compare runs in (the study's defaults, bf16 and channels_last, are the schema's)
    "precision": "fp32",
    "channels_last": False,
    "warmup_epochs": 0,
    "lr": 0.05,
    "seed": 0,
    "deterministic": True,
    "max_steps_per_epoch": 12,
    "checkpoint_every_steps": 5,
    "log_every_steps": 1,
    "step_timing_every": 4,
    "monitor_interval_s": 0.5,
    "target_accuracy": 0.05,
    "keep_checkpoints": True,  # the tests compare the finished runs' weights
    # the measurement window: steps 4..19 of 24, across the epoch boundary at 12
    "measure_warmup_steps": 4,
    "measure_steps": 16,
    "measure_intervals": 4,
}
STEPS_PER_EPOCH = 12


def _names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",")]


# The column and key lists as docs/architecture.md writes them
METRICS_DOC = _names(
    "epoch, train_loss, train_acc, test_loss, test_acc, epoch_time_s, images_per_s, images_per_s_per_gpu, "
    "global_batch, per_gpu_batch, world_size, lr, wall_time_s"
)
STEPS_DOC = _names("epoch, step, data_s, forward_s, backward_allreduce_s, optimizer_s, step_s")
RESULTS_DOC = _names(
    "epochs, steps, world_size, global_batch, per_gpu_batch, warmup_steps, measure_steps, measured_steps, "
    "measured_s, window_filled, images_per_s, images_per_s_per_gpu, step_time_s, images_per_s_min, "
    "images_per_s_max, images_per_s_cv, interval_images_per_s, measure_start_step, measure_start_s, "
    "measure_end_s, measure_attempt, first_step_s, whole_run_images_per_s, whole_run_images_per_s_per_gpu, "
    "whole_run_step_time_s, epoch_time_s, compile_s, inductor_cache_dir, ddp_options, final_test_acc, "
    "best_test_acc, final_train_loss, time_to_target_s, target_accuracy, total_time_s, resumed_from_step, "
    "resumes, device, device_name, backend"
)
STEP_LINE = re.compile(r"epoch (\d+)/\d+ step (\d+)/(\d+) ")
CHECKPOINT_LINE = re.compile(r"checkpoint \S*ckpt-(\d+)-")
LAUNCH_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")


def _launch_free_environ() -> dict[str, str]:
    """This process's environment without any launcher's variables (the tests may run under Slurm)."""
    return {k: v for k, v in os.environ.items() if k not in LAUNCH_VARIABLES and not k.startswith("SLURM_")}


@pytest.fixture(autouse=True)
def _single_process_and_one_thread(monkeypatch):
    for name in set(os.environ) - set(_launch_free_environ()):
        monkeypatch.delenv(name)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _global_step(line: str) -> int | None:
    """The global step a trainer progress line reports (epochs count from 1 in the log)."""
    match = STEP_LINE.search(line)
    return (int(match[1]) - 1) * int(match[3]) + int(match[2]) if match else None


def _pack(folder: Path, train_per_class: int, test_per_class: int) -> Path:
    arrays = generate_arrays(train_per_class, test_per_class, seed=0)
    for name, array in zip(
        ("train_images", "train_labels", "test_images", "test_labels"), arrays, strict=True
    ):
        np.save(folder / f"{name}.npy", array)
    return folder


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return _pack(tmp_path_factory.mktemp("packed"), train_per_class=32, test_per_class=10)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, data_dir):
    """make(name, **changes) -> (run folder, checkpoint folder, run config) for a run of BASE + changes."""
    root = tmp_path_factory.mktemp("runs")

    def make(name, **changes):
        folder = root / name
        config = {**BASE, "data_dir": str(data_dir), "checkpoint_dir": str(folder / "ckpt"), **changes}
        return folder / "run", folder / "ckpt", config

    return make


def _main(out_dir, config) -> int:
    return program.main(
        ["--run-config-json", json.dumps(config), "--out-dir", str(out_dir), "--log-level", "WARNING"]
    )


def _final(ckpt_dir) -> dict:
    state, _ = checkpoint.load_latest(ckpt_dir)
    return state


def _assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    different = [key for key in a if not torch.equal(a[key], b[key])]
    assert not different, f"tensors differ: {different[:5]}"


def _learning_columns(out_dir) -> pd.DataFrame:
    return pd.read_csv(out_dir / "metrics.csv")[["epoch", "train_loss", "train_acc", "test_loss", "test_acc"]]


@pytest.fixture(scope="module")
def reference(runs):
    """An uninterrupted fp32 run, with a torch.profiler window over steps 3 and 4."""
    out, ckpt, config = runs("reference", profile={"tool": "torch", "start_step": 3, "steps": 2})
    assert _main(out, config) == 0
    return out, ckpt, config


# --- the run folder ---------------------------------------------------------------------------------


def test_the_run_folder_holds_the_documented_files(reference):
    out, _, config = reference
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [
            "summary.json",
            "metrics.csv",
            "steps.csv",
            "gpu_monitor.csv",
            "gpu_monitor.json",
            "profile_ops.csv",
            "profile_kernels.csv",
            "profile_window.json",
        ]
    )
    metrics = pd.read_csv(out / "metrics.csv")
    assert list(metrics.columns) == METRICS_DOC == list(METRICS_COLUMNS)
    assert metrics.epoch.tolist() == [1, 2]
    assert (metrics.images_per_s > 0).all() and metrics.wall_time_s.is_monotonic_increasing
    assert metrics.lr.iloc[-1] == pytest.approx(0.0, abs=1e-9)  # cosine ends at zero
    assert (metrics.global_batch == 16).all() and (metrics.world_size == 1).all()
    steps = pd.read_csv(out / "steps.csv")
    assert list(steps.columns) == STEPS_DOC
    assert steps.step.tolist() == [0, 20]  # step_timing_every 4, none inside the window (4..19)
    phases = steps[["data_s", "forward_s", "backward_allreduce_s", "optimizer_s"]]
    assert (phases > 0).all().all()
    assert np.allclose(phases.sum(axis=1), steps.step_s)
    assert (out / "gpu_monitor.csv").read_text().startswith("time_s,host,gpu_index,gpu_uuid")
    assert json.loads((out / "gpu_monitor.json").read_text())["available"] is False


def test_the_summary_has_results_and_provenance(reference):
    out, _, config = reference
    summary = json.loads((out / "summary.json").read_text())
    assert summary["run"] == config
    results = summary["results"]
    assert set(RESULTS_DOC) <= set(results)
    metrics = pd.read_csv(out / "metrics.csv")
    assert results["epochs"] == 2 and results["steps"] == 2 * STEPS_PER_EPOCH
    assert results["epoch_time_s"] == pytest.approx(metrics.epoch_time_s.iloc[1])  # after the first epoch
    seconds, images = metrics.epoch_time_s.sum(), (metrics.images_per_s * metrics.epoch_time_s).sum()
    assert results["whole_run_images_per_s"] == pytest.approx(images / seconds)
    assert results["whole_run_step_time_s"] == pytest.approx(seconds / (2 * STEPS_PER_EPOCH))
    assert results["final_test_acc"] == pytest.approx(metrics.test_acc.iloc[-1])
    assert results["best_test_acc"] == pytest.approx(metrics.test_acc.max())
    assert results["time_to_target_s"] == pytest.approx(metrics.wall_time_s.iloc[0])  # target 0.05
    assert results["resumed_from_step"] is None and results["device"] == "cpu"
    assert results["train_flops_per_image"] == 3 * results["forward_flops_per_image"]
    assert summary["provenance"]["config_hash"] == provenance.config_hash(config)
    assert summary["provenance"]["world_size"] == 1
    assert summary["provenance"]["hosts"] == [socket.gethostname()]
    ieee = {"cudnn_conv": "ieee", "cudnn_rnn": "ieee", "cuda_matmul": "ieee"}  # fp32: no TF32 (issue 24)
    assert summary["provenance"]["fp32_math"] == ieee and results["precision_effective"] == "fp32"


# --- the steady-state measurement window ----------------------------------------------------------


def _results(out) -> dict:
    return json.loads((out / "summary.json").read_text())["results"]


def test_a_window_longer_than_an_epoch_measures_its_steps_across_the_epoch_boundary(reference):
    """12 steps per epoch, a window of 16 after 4 warm-up steps: steps 4..19, epoch end included
    (its evaluation and checkpoint paused out of the window)."""
    out, _, _ = reference
    r = _results(out)
    assert r["window_filled"] is True
    assert (r["warmup_steps"], r["measure_steps"], r["measured_steps"]) == (4, 16, 16)
    assert r["measure_start_step"] == 4 and r["measure_attempt"] == 0
    assert r["images_per_s"] == pytest.approx(16 * 16 / r["measured_s"])
    assert r["images_per_s_per_gpu"] == r["images_per_s"]
    assert r["step_time_s"] == pytest.approx(r["measured_s"] / 16)
    assert len(r["interval_images_per_s"]) == 4
    assert r["images_per_s_min"] <= r["images_per_s"] <= r["images_per_s_max"]
    assert r["first_step_s"] > 0
    assert 0 < r["measure_start_s"] < r["measure_end_s"] < r["total_time_s"] + 5
    # the pauses (one evaluation, checkpoints at 5, 10, 12, 15, profiler output) are not in measured_s
    assert r["measured_s"] < r["measure_end_s"] - r["measure_start_s"]


def test_the_window_reports_where_its_steps_went_on_the_cpu(reference):
    """One rank's parts (scalestudy.train.step_parts): its step time is the window's, the loader's
    wait and the time after its last gradient are parts of it, and the CPU has no device span."""
    r = _results(reference[0])
    parts = r["step_parts"]
    assert parts["step_s"] == [pytest.approx(r["step_time_s"])]
    assert 0 < parts["data_wait_s"][0] < parts["step_s"][0]
    assert 0 < parts["gradient_wait_s"][0] < parts["step_s"][0]  # the hook on the stem's weight fired
    assert parts["device_busy_s"] is None  # not measured on the CPU, never a zero


@pytest.mark.parametrize("epochs", [2, 3])
def test_the_trainer_synchronises_at_the_window_edges_never_per_step(runs, monkeypatch, epochs):
    """start, after the first step, window open, 4 sub-interval ends, and the two edges of the one
    pause inside the window (the evaluation after epoch 1): 9, however many steps the run has."""
    calls = []
    monkeypatch.setattr(
        train.Trainer, "synchronize", lambda self: calls.append(self.state.position.global_step)
    )
    out, _, config = runs(f"syncs_{epochs}", epochs=epochs, checkpoint_every_steps=0, step_timing_every=0)
    assert _main(out, config) == 0
    # the position's global step at each call: after a step, the index of that step (0 = the first;
    # the window opens after step 3 and its intervals end after steps 7, 11, 15, 19); at the
    # epoch-end pause, the 12 steps done
    assert calls == [0, 0, 3, 7, 11, 12, 12, 15, 19]


def test_a_run_too_short_to_fill_its_window_says_so(runs, capsys):
    out, _, config = runs("short_window", epochs=1, max_steps_per_epoch=6, eval_max_batches=1)
    assert _main(out, config) == 0
    r = _results(out)
    assert r["window_filled"] is False and r["measured_steps"] == 2  # steps 4 and 5
    assert r["images_per_s"] is None and r["images_per_s_per_gpu"] is None and r["step_time_s"] is None
    assert r["whole_run_images_per_s"] > 0 and r["whole_run_step_time_s"] > 0
    assert "measurement window not filled: 2 of 16 steps" in capsys.readouterr().err


def test_the_analysis_marks_a_run_that_did_not_fill_its_window(runs, tmp_path, monkeypatch):
    """Two real one-rank runs of 6 steps: weak fills a window of 4, strong cannot fill one of 16.
    runs.csv -> scaling.csv mark the strong point, and the throughput figure draws it hollow."""
    from scalestudy.analysis import aggregate, metrics, settings
    from scalestudy.plots import scaling, style

    short = {"epochs": 1, "max_steps_per_epoch": 6, "eval_max_batches": 1, "precision": "fp32"}
    short["stage"] = "scaling"
    summaries = []
    for mode, steps in (("weak", 4), ("strong", 16)):
        window = {"measure_warmup_steps": 1, "measure_steps": steps, "measure_intervals": 2}
        out, _, config = runs(f"analysis_{mode}", **short, **window, mode=mode, point=f"{mode}/w1_r0")
        assert _main(out, config) == 0
        summaries.append(out / "summary.json")
    catalog = aggregate.build_catalog(summaries)
    catalog.to_csv(tmp_path / "runs.csv", index=False)
    stored = pd.read_csv(tmp_path / "runs.csv").set_index("config.mode")
    assert stored.loc["weak", "window_filled"] and not stored.loc["strong", "window_filled"]
    assert np.isnan(stored.loc["strong", "images_per_s"]) and stored.loc["strong", "measured_steps"] == 5
    analysis = settings.resolved({})
    table = metrics.scaling_table(metrics.run_metrics(pd.read_csv(tmp_path / "runs.csv"), analysis), analysis)
    table = table.set_index("mode")
    assert not table.loc["strong", "window_filled"] and "window not filled" in table.loc["strong", "note"]
    assert table.loc["weak", "window_filled"] and table.loc["strong", "images_per_s_mean"] > 0  # whole run
    drawn = []
    monkeypatch.setattr(style, "save_figure", lambda fig, png, pdf=None: drawn.append(fig))
    scaling.throughput(table.reset_index(), tmp_path / "throughput.png")
    hollow = [line for line in drawn[0].axes[0].get_lines() if line.get_markerfacecolor() == "white"]
    assert [list(line.get_xdata()) for line in hollow] == [[1], []]  # the point, its legend entry
    assert scaling.UNFILLED_LABEL in [t.get_text() for t in drawn[0].axes[0].get_legend().get_texts()]


WINDOW_RESUME = {"measure_warmup_steps": 2, "measure_steps": 8, "measure_intervals": 2}


def test_the_window_restarts_after_a_fresh_warm_up_when_a_run_resumes_inside_it(runs, reference):
    """Attempt 0 is stopped at step 6, inside its window (2..9): the window is discarded. Attempt 1
    (from step 6) warms up again and measures steps 8..15. Attempt 2 (from 20) has 4 steps, too
    few: the run reports attempt 1's window, kept in the checkpoints, without monitor times."""
    out, ckpt, config = runs("window_resume", **WINDOW_RESUME)
    with _SignalAtStep(signal.SIGTERM, 6):
        assert _main(out, config) == train.EXIT_RESUMABLE
    assert _final(ckpt)["history"]["steady_window"] is None
    with _SignalAtStep(signal.SIGTERM, 20):
        assert _main(out, config) == train.EXIT_RESUMABLE
    kept = _final(ckpt)["history"]["steady_window"]
    assert (kept["measure_attempt"], kept["measure_start_step"], kept["window_filled"]) == (1, 8, True)
    assert kept["measure_start_s"] is not None
    assert _main(out, config) == 0
    r = _results(out)
    assert r["resumes"] == [6, 20] and r["window_filled"] is True and r["measured_steps"] == 8
    assert (r["measure_attempt"], r["measure_start_step"]) == (1, 8)
    assert r["measure_start_s"] is None and r["measure_end_s"] is None
    assert r["images_per_s"] == pytest.approx(kept["images_per_s"])
    assert r["step_parts"] == kept["step_parts"] and r["step_parts"]["data_wait_s"][0] > 0
    _assert_same_weights(_final(ckpt)["model"], _final(reference[1])["model"])  # the window changes nothing


def test_a_resumed_attempt_that_fills_its_window_reports_it_with_its_times(runs):
    out, ckpt, config = runs("window_resume_last", **WINDOW_RESUME)
    with _SignalAtStep(signal.SIGUSR1, 3):
        assert _main(out, config) == train.EXIT_RESUMABLE
    assert _main(out, config) == 0
    r = _results(out)
    assert (r["measure_attempt"], r["measure_start_step"], r["measured_steps"]) == (1, 5, 8)
    assert r["window_filled"] and 0 < r["measure_start_s"] < r["measure_end_s"]


def test_the_profile_window_covers_exactly_its_steps(reference):
    out, _, _ = reference
    window = json.loads((out / "profile_window.json").read_text())
    assert {k: window[k] for k in ("tool", "start_step", "steps", "world_size", "rank")} == {
        "tool": "torch",
        "start_step": 3,
        "steps": 2,
        "world_size": 1,
        "rank": 0,
    }
    assert window["wall_s"] > 0
    ops = pd.read_csv(out / "profile_ops.csv").set_index("name")
    assert list(ops.columns) == ["count", "self_cpu_us", "cpu_total_us", "self_device_us", "device_total_us"]
    for phase in ("step", "data", "forward", "backward", "optimizer"):
        assert ops.loc[phase, "count"] == 2, phase


def test_two_checkpoints_are_kept_and_the_last_one_is_the_end(reference):
    """keep_checkpoints: the last two stay, marked finished (never to be resumed)."""
    _, ckpt, _ = reference
    files = sorted(p.name for p in ckpt.iterdir())
    assert [name[:14] for name in files] == ["ckpt-000000020", "ckpt-000000024", policy.FINISHED]
    assert _final(ckpt)["position"] == {"epoch": 2, "step": 0, "global_step": 24}


def test_the_classic_dataloader_mode_trains_the_same_steps(runs, reference):
    out, _, config = runs("dataloader", loader="dataloader", num_workers=1, checkpoint_every_steps=0)
    assert _main(out, config) == 0
    metrics, tensor_mode = pd.read_csv(out / "metrics.csv"), pd.read_csv(reference[0] / "metrics.csv")
    assert json.loads((out / "summary.json").read_text())["results"]["steps"] == 2 * STEPS_PER_EPOCH
    assert metrics.test_acc.notna().all() and not metrics.train_loss.equals(tensor_mode.train_loss)


@pytest.mark.parametrize(("hook", "dtype"), [("fp16", torch.float16), ("bf16", torch.bfloat16)])
def test_comm_hooks_send_gradients_in_half_precision(hook, dtype):
    """One-rank gloo group: the all-reduced gradient is the local one rounded to the hook's dtype."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    distributed.init_process_group(distributed.DistEnv(0, 0, 1, "127.0.0.1", port, "single"), "gloo", 30)
    try:
        torch.manual_seed(0)
        layer = torch.nn.Linear(64, 8)
        x = torch.randn(4, 64)
        layer(x).square().sum().backward()
        exact = layer.weight.grad.clone()
        ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 8))
        ddp.module.load_state_dict(layer.state_dict())
        ddp.register_comm_hook(None, COMM_HOOKS[hook])
        ddp(x).square().sum().backward()
        reduced = ddp.module.weight.grad
        assert torch.equal(reduced, exact.to(dtype).float()) and not torch.equal(reduced, exact)
    finally:
        distributed.destroy_process_group()


# --- precision and learning ---------------------------------------------------------------------------

# |epoch-mean train loss - fp32's| in nats, over 2 epochs of 6 steps (fp16 convolutions run ~8x
# slower than fp32 on a CPU without native fp16). Early training at batch 16 is chaotic: any rounding
# change moves the loss by a few hundredths (measured over 2 x 8 steps: bf16 0.009/0.042, fp16
# 0.022/0.057).
PRECISION_BAND = 0.1
SHORT = {"max_steps_per_epoch": 6, "eval_max_batches": 3, "checkpoint_every_steps": 0}


@pytest.fixture(scope="module")
def short_fp32(runs):
    out, _, config = runs("short_fp32", **SHORT)
    assert _main(out, config) == 0
    return out


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_reduced_precision_tracks_fp32(runs, short_fp32, precision):
    out, _, config = runs(precision, precision=precision, **SHORT)
    assert _main(out, config) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["results"]["precision_effective"] == precision  # really ran, no fp32 fallback
    ours, fp32 = _learning_columns(out), _learning_columns(short_fp32)
    gap = (ours.train_loss - fp32.train_loss).abs()
    assert (gap < PRECISION_BAND).all(), gap.tolist()
    assert not ours.train_loss.equals(fp32.train_loss)  # in another precision


LEARN_ACCURACY = 0.3  # 10 classes: chance is 0.1; this configuration reaches 0.41 (deterministic)


def test_training_on_the_synthetic_data_learns(tmp_path):
    """3,000 images twice: the cheapest setting found that clearly learns (1,000 images three
    times stays near 0.2: this data needs variety more than repetition)."""
    data = _pack(tmp_path, train_per_class=300, test_per_class=30)
    config = {
        **BASE,
        "data_dir": str(data),
        "checkpoint_dir": str(tmp_path / "ckpt"),
        "per_gpu_batch": 32,
        "global_batch": 32,
        "base_batch": 32,
        "max_steps_per_epoch": None,
        "checkpoint_every_steps": 0,
        "channels_last": True,
        "log_every_steps": 50,
    }
    assert _main(tmp_path / "run", config) == 0
    metrics = pd.read_csv(tmp_path / "run" / "metrics.csv")
    assert metrics.test_acc.iloc[-1] >= LEARN_ACCURACY, metrics.to_string()
    assert metrics.train_loss.iloc[-1] < metrics.train_loss.iloc[0] - 0.2


# --- stop signals and resume ----------------------------------------------------------------------------


class _SignalAtStep(logging.Handler):
    """Sends `signum` to this process when the trainer logs global step `step` (between steps)."""

    def __init__(self, signum: int, step: int) -> None:
        super().__init__()
        self.signum, self.step = signum, step

    def emit(self, record) -> None:
        if _global_step(record.getMessage()) == self.step:
            os.kill(os.getpid(), self.signum)

    def __enter__(self):
        train.log.addHandler(self)
        train.log.setLevel(logging.INFO)  # the runs log at WARNING; the step lines must still be made
        return self

    def __exit__(self, *exc):
        train.log.removeHandler(self)
        train.log.setLevel(logging.NOTSET)


@pytest.mark.parametrize("trial", range(2))
def test_runs_stopped_by_signals_at_random_steps_resume_to_identical_weights(runs, reference, trial):
    """Two signals per trial at random global steps (trial 0 also at the end of epoch 1); each
    attempt exits 75 after a checkpoint of the step it was in; the last one finishes the run."""
    rng = random.Random(trial)
    stops = sorted(rng.sample(range(1, 2 * STEPS_PER_EPOCH - 1), 2))
    if trial == 0:
        stops[0] = STEPS_PER_EPOCH
    out, ckpt, config = runs(f"signals{trial}")
    for stop, signum in zip(stops, (signal.SIGTERM, signal.SIGUSR1), strict=True):
        with _SignalAtStep(signum, stop):
            assert _main(out, config) == train.EXIT_RESUMABLE
        assert _final(ckpt)["position"]["global_step"] == stop
        assert not out.exists()  # an interrupted attempt writes nothing into the run folder
    assert _main(out, config) == 0
    _assert_same_weights(_final(ckpt)["model"], _final(reference[1])["model"])
    pd.testing.assert_frame_equal(_learning_columns(out), _learning_columns(reference[0]))
    summary = json.loads((out / "summary.json").read_text())["results"]
    assert summary["resumed_from_step"] == stops[-1] and summary["resumes"] == stops


def _start_trainer(out, config, env=None, stderr=subprocess.PIPE) -> subprocess.Popen:
    command = [sys.executable, "-m", "scalestudy.train", "--run-config-json", json.dumps(config)]
    return subprocess.Popen(
        [*command, "--out-dir", str(out)],
        cwd=REPO,
        env={**_launch_free_environ(), "OMP_NUM_THREADS": "1", **(env or {})},
        stderr=stderr,
        text=True,
    )


def _signal_at_step(process: subprocess.Popen, step: int, signum: int, target_pid: int | None = None) -> str:
    """Read the trainer's log until it reports global step `step`, then send `signum` (to
    `target_pid`, default the trainer) while the next step runs; returns the whole log."""
    lines = []
    for line in process.stderr:
        lines.append(line)
        if _global_step(line) == step:
            os.kill(target_pid or process.pid, signum)
            break
    lines += process.stderr.readlines()
    process.wait(timeout=120)
    return "".join(lines)


def _last(pattern: re.Pattern, log: str) -> int:
    return [int(m[1]) for m in pattern.finditer(log)][-1]


def test_sigterm_mid_step_in_a_real_process_then_resume(runs, reference):
    """The signal lands while the next step runs: that step is finished, checkpointed, exit 75."""
    step = random.Random(7).randrange(2, 2 * STEPS_PER_EPOCH - 3)
    out, ckpt, config = runs("sigterm_process")
    process = _start_trainer(out, config)
    log = _signal_at_step(process, step, signal.SIGTERM)
    assert process.returncode == train.EXIT_RESUMABLE, log
    last_step = max(filter(None, map(_global_step, log.splitlines())))
    assert step <= last_step == _final(ckpt)["position"]["global_step"]  # the step it was in, no further
    assert _main(out, config) == 0
    _assert_same_weights(_final(ckpt)["model"], _final(reference[1])["model"])


def test_sigkill_between_checkpoints_then_resume(runs, reference):
    """Killed without warning: the retry resumes from the last periodic checkpoint and repeats steps."""
    out, ckpt, config = runs("sigkill")
    process = _start_trainer(out, config)
    log = _signal_at_step(process, 17, signal.SIGKILL)  # after the checkpoint at 15, before 20
    assert process.returncode == -signal.SIGKILL, log
    saved, last_step = _last(CHECKPOINT_LINE, log), max(filter(None, map(_global_step, log.splitlines())))
    assert saved % 5 == 0 and last_step > saved  # steps after the checkpoint were lost
    assert _final(ckpt)["position"]["global_step"] == saved
    assert _main(out, config) == 0
    _assert_same_weights(_final(ckpt)["model"], _final(reference[1])["model"])
    assert json.loads((out / "summary.json").read_text())["results"]["resumed_from_step"] == saved


def test_a_checkpoint_of_another_run_config_is_removed_not_resumed(runs, reference, capsys):
    """An older version of the output must not block the new one: a warning names the checkpoint
    and both config hashes, the run starts from scratch, and, finished, retires its checkpoints."""
    _, reference_ckpt, config = reference
    out, ckpt, _ = runs("other_config")
    shutil.copytree(reference_ckpt, ckpt)
    old_name = max(p.name for p in ckpt.glob("ckpt-*.pt"))
    changed = {**config, "lr": 0.1, "checkpoint_dir": str(ckpt), "keep_checkpoints": False, "profile": None}
    assert _main(out, changed) == 0
    err = capsys.readouterr().err
    hashes = [provenance.config_hash({**runconfig.DEFAULTS, **run}) for run in (config, changed)]
    assert all(text in err for text in (old_name, *hashes, "lr: 0.05 -> 0.1")), err
    assert json.loads((out / "summary.json").read_text())["results"]["resumed_from_step"] is None
    # the other run config's newest is set aside (issue 23, item 8); this run's last stays, marked
    # finished (item 5: a retry of the job rewrites the outputs from it)
    kept = sorted(p.relative_to(ckpt).parts[:2] for p in ckpt.rglob("*.pt"))
    assert kept == [(max(p.name for p in ckpt.glob("ckpt-*.pt")),), ("superseded", hashes[0][:16])]
    results = json.loads((out / "summary.json").read_text())["results"]  # the run catalog shows it
    assert results["superseded_checkpoints"] == [str(p) for p in (ckpt / "superseded").glob("*/*")]


def test_a_finished_run_asked_for_again_measures_anew(runs):
    """Its summary.json deleted, the run is trained again: not resumed from its last checkpoint."""
    out, ckpt, config = runs("again", epochs=1, max_steps_per_epoch=3, eval_max_batches=1)
    assert _main(out, config) == 0
    first = json.loads((out / "summary.json").read_text())
    (out / "summary.json").unlink()
    time.sleep(1.1)  # provenance's timestamp counts seconds
    assert _main(out, config) == 0
    second = json.loads((out / "summary.json").read_text())
    assert second["results"]["resumed_from_step"] is None and second["results"]["resumes"] == []
    assert second["provenance"]["timestamp"] != first["provenance"]["timestamp"]


def test_a_run_killed_before_writing_its_outputs_resumes_to_write_them(runs):
    """The last epoch's checkpoint is written, then the job dies before its run folder is: the retry
    resumes at the end (training nothing again) and writes the outputs of the measured run."""
    out, ckpt, config = runs("unwritten", epochs=1, max_steps_per_epoch=3, eval_max_batches=1)
    assert _main(out, config) == 0
    first = json.loads((out / "summary.json").read_text())
    (out / "summary.json").unlink()
    (ckpt / policy.FINISHED).unlink()  # as if the job had died before finish()
    assert _main(out, config) == 0
    second = json.loads((out / "summary.json").read_text())["results"]
    assert second["resumed_from_step"] == first["results"]["steps"] == 3
    assert second["final_test_acc"] == first["results"]["final_test_acc"]
    assert second["epochs"] == 1


def test_a_window_in_seconds_lasts_that_long_in_whole_steps_and_trains_the_same(runs, reference):
    """train.measure.seconds: a window of 2 steps is too short, the window is planned from the
    warm-up's rate with the steps the seconds take; the training (batches, weights) is the
    reference's, bit for bit. The seconds are 3 steps of the reference's fastest interval."""
    seconds = 3 * reference[2]["global_batch"] / _results(reference[0])["images_per_s_max"]
    out, ckpt, config = runs("seconds", measure_steps=2, measure_intervals=2, measure_seconds=seconds)
    assert _main(out, config) == 0
    r = _results(out)
    assert r["window_filled"] and r["measure_seconds"] == seconds and r["measured_s"] >= seconds, r
    assert r["measured_steps"] == r["measure_steps"]
    # planned from the warm-up's rate as it opens, after the warm-up; extended if the steps got faster
    assert r["measure_start_step"] == 4 and r["measure_steps"] >= 2
    assert r["contended"] is False and r["monitor_window_samples"] is None  # no GPU: nothing judged
    _assert_same_weights(_final(ckpt)["model"], _final(reference[1])["model"])


def test_the_summary_reports_the_start_up_to_the_first_steps_end_in_parts(reference):
    """scalestudy.train.startup: run in this process (no launcher), counted from its start."""
    r = _results(reference[0])
    parts = r["startup_parts_s"]
    stages = ["imports", "config", "settings", "process_group", "data", "model", "setup", "resume"]
    assert set(parts) == {f"{stage}_s" for stage in [*stages, "first_step"]}, parts
    assert all(seconds >= 0 for seconds in parts.values()) and r["startup_from"] == "process start"
    # the part is a difference of two wall-clock marks (seconds since 1970: about 2.4e-7 s apart)
    assert parts["first_step_s"] == pytest.approx(r["first_step_s"], abs=1e-6)
    assert sum(parts.values()) == pytest.approx(r["startup_s"])


# --- DDP with real processes --------------------------------------------------------------------------

DDP = {
    **{"world_size": 2, "per_gpu_batch": 8, "global_batch": 16, "norm": "frozen", "max_steps_per_epoch": 10},
    "pg_timeout_s": 60,  # a rank left waiting in a collective fails the test instead of hanging it
}
DDP_STEPS_PER_EPOCH = 10


def _torchrun_to_the_end(out, config) -> None:
    """A 2-rank run under torchrun --standalone that must finish."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    command += ["-m", "scalestudy.train", "--run-config-json", json.dumps(config), "--out-dir", str(out)]
    env = {**_launch_free_environ(), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-5000:]


@pytest.fixture(scope="module")
def torchrun_run(runs):
    out, ckpt, config = runs("torchrun", **DDP)
    _torchrun_to_the_end(out, config)
    return out, ckpt, config


def test_two_ranks_agree_on_when_a_window_in_seconds_ends(runs):
    """Each rank times its own steps; the window's seconds are averaged over the ranks (a gloo
    all-reduce), so both plan the same steps: a disagreement would leave one rank in a collective
    the other never joins (pg_timeout_s: the run fails)."""
    changes = {"measure_steps": 2, "measure_intervals": 1, "measure_seconds": 0.3, "epochs": 6}  # 60 steps
    out, _, config = runs("torchrun_seconds", **{**DDP, **changes})
    _torchrun_to_the_end(out, config)
    r = json.loads((out / "summary.json").read_text())["results"]
    # the agreements run as the window opens (the warm-up's rate) and as it closes (extended if short)
    assert r["window_filled"] and r["measured_s"] >= 0.25 and r["measured_steps"] == r["measure_steps"], r
    assert r["measure_start_step"] == DDP.get("measure_warmup_steps", BASE["measure_warmup_steps"]), r


def _flat(state: dict) -> torch.Tensor:
    return torch.cat([t.flatten().double() for t in state.values() if t.is_floating_point()])


EQUIVALENCE_TOLERANCE = 1e-3  # |two ranks - one rank| / |distance the weights moved|


def test_two_ranks_of_batch_b_train_like_one_rank_of_batch_2b(runs, torchrun_run):
    """With per-sample normalisation ("frozen" BatchNorm statistics; SyncBatchNorm refuses the CPU)
    and world-size-independent sharding and augmentation, DDP's averaged gradient is the big batch's
    gradient: the weights agree up to float rounding (measured ~2e-4 of the distance moved). Plain
    BatchNorm normalises each rank's 8 samples by themselves, and differs by ~100% (measured)."""
    out, ckpt, config = torchrun_run
    seed_everything(0)  # the trainer's first use of the generator is the model
    initial = _flat(model.build_model(8, norm="frozen").state_dict())
    two_ranks = _flat(_final(ckpt)["model"])
    one_rank = runs("one_rank_2b", **{**DDP, "world_size": 1, "per_gpu_batch": 16})
    wrong = runs("one_rank_b", **{**DDP, "world_size": 1, "global_batch": 8, "lr_scaling": "none"})  # control
    for run in (one_rank, wrong):
        assert _main(run[0], run[2]) == 0
    moved = (two_ranks - initial).norm()
    assert (_flat(_final(one_rank[1])["model"]) - two_ranks).norm() / moved < EQUIVALENCE_TOLERANCE
    assert (_flat(_final(wrong[1])["model"]) - two_ranks).norm() / moved > 100 * EQUIVALENCE_TOLERANCE
    summary = json.loads((out / "summary.json").read_text())
    assert summary["results"]["world_size"] == 2 and summary["results"]["backend"] == "gloo"
    assert summary["provenance"]["launcher"] == "torchrun" and len(summary["provenance"]["ranks"]) == 2
    assert len(json.loads((out / "gpu_monitor.json").read_text())["nodes"]) == 1  # one sampler per node
    parts = summary["results"]["step_parts"]  # every rank's, gathered when the window filled
    assert len(parts["step_s"]) == len(parts["data_wait_s"]) == len(parts["gradient_wait_s"]) == 2
    assert parts["step_s"][0] == pytest.approx(summary["results"]["step_time_s"])
    assert all(0 < wait < step for wait, step in zip(parts["gradient_wait_s"], parts["step_s"], strict=True))


def _free_slurm_job_id() -> int:
    """A job id whose derived rendezvous port is free here (the srun path derives it)."""
    for job_id in random.Random().sample(range(1000), 50):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", distributed.slurm_port(str(job_id))))
                return job_id
            except OSError:
                continue
    pytest.skip("no free port in the Slurm-derived range")


def _srun_style_ranks(out, config, job_id: int, rank1_log: Path) -> list[subprocess.Popen]:
    """Two ranks started the way srun starts them: SLURM_* variables only, no MASTER_*."""
    env = {"SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "localhost", "SLURM_JOB_ID": str(job_id)}
    rank0 = _start_trainer(out, config, {**env, "SLURM_PROCID": "0", "SLURM_LOCALID": "0"})
    with open(rank1_log, "a") as log:  # nobody reads rank 1's pipe while it runs: a file cannot fill up
        rank1 = _start_trainer(out, config, {**env, "SLURM_PROCID": "1", "SLURM_LOCALID": "1"}, stderr=log)
    return [rank0, rank1]


def test_srun_style_ranks_stop_together_on_a_signal_to_one_and_resume_exactly(runs, torchrun_run, tmp_path):
    """SIGTERM reaches rank 1 only: both ranks agree, checkpoint the same step and exit 75; the
    retry (srun-style again) ends with the torchrun run's weights, bit for bit."""
    out, ckpt, config = runs("srun", **DDP)
    step = random.Random(3).randrange(2, 2 * DDP_STEPS_PER_EPOCH - 3)
    job_id = _free_slurm_job_id()
    rank0, rank1 = _srun_style_ranks(out, config, job_id, tmp_path / "rank1.log")
    log = _signal_at_step(rank0, step, signal.SIGTERM, target_pid=rank1.pid)
    rank1.wait(timeout=120)
    assert (rank0.returncode, rank1.returncode) == (train.EXIT_RESUMABLE,) * 2, log
    stopped_at = _final(ckpt)["position"]["global_step"]
    assert step <= stopped_at == max(filter(None, map(_global_step, log.splitlines())))
    ranks = _srun_style_ranks(out, config, job_id, tmp_path / "rank1.log")
    log = ranks[0].communicate(timeout=300)[1]
    ranks[1].wait(timeout=60)
    assert [rank.returncode for rank in ranks] == [0, 0], log[-3000:] + (tmp_path / "rank1.log").read_text()
    _assert_same_weights(_final(ckpt)["model"], _final(torchrun_run[1])["model"])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["results"]["resumed_from_step"] == stopped_at
    assert summary["provenance"]["launcher"] == "srun"


@pytest.fixture(scope="module")
def torchrun_batchnorm_run(runs):
    """Two ranks with plain BatchNorm (statistics per rank), uninterrupted."""
    out, ckpt, config = runs("torchrun_bn", **{**DDP, "norm": "batch"})
    _torchrun_to_the_end(out, config)
    return out, ckpt, config


def test_two_ranks_stopped_after_an_epochs_last_step_resume_to_the_same_metrics_bit_for_bit(
    runs, torchrun_batchnorm_run, tmp_path
):
    """The ranks' BatchNorm statistics differ while training (no buffer broadcast); a resume hands
    every rank rank 0's. Evaluation takes rank 0's on every rank, so the test metrics (and the
    carried float64 train totals) are the same whether or not the run stopped at the epoch end."""
    out, ckpt, config = runs("srun_epoch_end", **{**DDP, "norm": "batch"})
    job_id = _free_slurm_job_id()
    rank0, rank1 = _srun_style_ranks(out, config, job_id, tmp_path / "rank1.log")
    # signalled while step 10 (the epoch's last) runs or rank 0 waits for step 9's agreement: the
    # ranks stop after step 10, before the epoch's evaluation or right after it
    log = _signal_at_step(rank0, DDP_STEPS_PER_EPOCH - 1, signal.SIGTERM, target_pid=rank1.pid)
    rank1.wait(timeout=120)
    assert (rank0.returncode, rank1.returncode) == (train.EXIT_RESUMABLE,) * 2, log
    assert _final(ckpt)["position"]["global_step"] == DDP_STEPS_PER_EPOCH
    ranks = _srun_style_ranks(out, config, job_id, tmp_path / "rank1.log")
    log = ranks[0].communicate(timeout=300)[1]
    ranks[1].wait(timeout=60)
    assert [rank.returncode for rank in ranks] == [0, 0], log[-3000:] + (tmp_path / "rank1.log").read_text()
    reference_out, reference_ckpt, _ = torchrun_batchnorm_run
    pd.testing.assert_frame_equal(_learning_columns(out), _learning_columns(reference_out), check_exact=True)
    _assert_same_weights(_final(ckpt)["model"], _final(reference_ckpt)["model"])
    ddp = _results(out)["ddp_options"]
    assert ddp["static_graph"] is True and ddp["batched_grad_copy"] is True
    assert ddp.get("forward_sync_buffers", ddp.get("broadcast_buffers")) is False
