"""The trainer end to end on CPU, against one uninterrupted reference run (trained once, in this
module): its run folder, summary, measurement and profile windows, start-up parts and kept
checkpoints; the runs that must end with its weights (resumed after SIGTERM, SIGUSR1 or SIGKILL, in
this process or a real one; a window restarted by a resume; a window in seconds) or train other
steps (the classic data loader); and a finished, unwritten or other run config's run asked for again.

The run and the helpers these modules share: tests/trainer_runs.py. Windows that need no reference
run: tests/test_train_window.py; precision and learning: tests/test_train_precision.py; DDP with
real processes: tests/test_train_ddp.py.
"""

import json
import random
import re
import shutil
import signal
import socket
import time

import numpy as np
import pandas as pd
import pytest

from scalestudy import contract, provenance
from scalestudy.plan import runconfig
from scalestudy.plan.runfiles import METRICS_COLUMNS
from scalestudy.train.checkpoint import policy
from tests.inprocess import (
    SignalAtStep,
    one_process_one_thread,  # noqa: F401 (autouse)
)
from tests.trainer_runs import (
    STEPS_PER_EPOCH,
    assert_same_weights,
    final,
    last_step,
    learning_columns,
    main,
    run_maker,
    signal_at_step,
    start_trainer,
    summary_results,
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return run_maker(tmp_path_factory)


def _names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",")]


# The column and key lists as docs/reference/files.md writes them
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
CHECKPOINT_LINE = re.compile(r"checkpoint \S*ckpt-(\d+)-")


@pytest.fixture(scope="module")
def reference(runs):
    """An uninterrupted fp32 run, with a torch.profiler window over steps 3 and 4."""
    out, ckpt, config = runs("reference", profile={"tool": "torch", "start_step": 3, "steps": 2})
    assert main(out, config) == 0
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


def test_a_window_longer_than_an_epoch_measures_its_steps_across_the_epoch_boundary(reference):
    """12 steps per epoch, a window of 16 after 4 warm-up steps: steps 4..19, epoch end included
    (its evaluation and checkpoint paused out of the window)."""
    out, _, _ = reference
    r = summary_results(out)
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
    r = summary_results(reference[0])
    parts = r["step_parts"]
    assert parts["step_s"] == [pytest.approx(r["step_time_s"])]
    assert 0 < parts["data_wait_s"][0] < parts["step_s"][0]
    assert 0 < parts["gradient_wait_s"][0] < parts["step_s"][0]  # the hook on the stem's weight fired
    assert parts["device_busy_s"] is None  # not measured on the CPU, never a zero


WINDOW_RESUME = {"measure_warmup_steps": 2, "measure_steps": 8, "measure_intervals": 2}


def test_the_window_restarts_after_a_fresh_warm_up_when_a_run_resumes_inside_it(runs, reference):
    """Attempt 0 is stopped at step 6, inside its window (2..9): the window is discarded. Attempt 1
    (from step 6) warms up again and measures steps 8..15. Attempt 2 (from 20) has 4 steps, too
    few: the run reports attempt 1's window, kept in the checkpoints, without monitor times."""
    out, ckpt, config = runs("window_resume", **WINDOW_RESUME)
    with SignalAtStep(6):
        assert main(out, config) == contract.EXIT_RESUMABLE
    assert final(ckpt)["history"]["steady_window"] is None
    with SignalAtStep(20):
        assert main(out, config) == contract.EXIT_RESUMABLE
    kept = final(ckpt)["history"]["steady_window"]
    assert (kept["measure_attempt"], kept["measure_start_step"], kept["window_filled"]) == (1, 8, True)
    assert kept["measure_start_s"] is not None
    assert main(out, config) == 0
    r = summary_results(out)
    assert r["resumes"] == [6, 20] and r["window_filled"] is True and r["measured_steps"] == 8
    assert (r["measure_attempt"], r["measure_start_step"]) == (1, 8)
    assert r["measure_start_s"] is None and r["measure_end_s"] is None
    assert r["images_per_s"] == pytest.approx(kept["images_per_s"])
    assert r["step_parts"] == kept["step_parts"] and r["step_parts"]["data_wait_s"][0] > 0
    assert_same_weights(final(ckpt)["model"], final(reference[1])["model"])  # the window changes nothing


def test_a_resumed_attempt_that_fills_its_window_reports_it_with_its_times(runs):
    out, ckpt, config = runs("window_resume_last", **WINDOW_RESUME)
    with SignalAtStep(3, signal.SIGUSR1):
        assert main(out, config) == contract.EXIT_RESUMABLE
    assert main(out, config) == 0
    r = summary_results(out)
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
    assert final(ckpt)["position"] == {"epoch": 2, "step": 0, "global_step": 24}


def test_the_classic_dataloader_mode_trains_the_same_steps(runs, reference):
    out, _, config = runs("dataloader", loader="dataloader", num_workers=1, checkpoint_every_steps=0)
    assert main(out, config) == 0
    metrics, tensor_mode = pd.read_csv(out / "metrics.csv"), pd.read_csv(reference[0] / "metrics.csv")
    assert summary_results(out)["steps"] == 2 * STEPS_PER_EPOCH
    assert metrics.test_acc.notna().all() and not metrics.train_loss.equals(tensor_mode.train_loss)


# --- stop signals and resume ----------------------------------------------------------------------------


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
        with SignalAtStep(stop, signum):
            assert main(out, config) == contract.EXIT_RESUMABLE
        assert final(ckpt)["position"]["global_step"] == stop
        assert not out.exists()  # an interrupted attempt writes nothing into the run folder
    assert main(out, config) == 0
    assert_same_weights(final(ckpt)["model"], final(reference[1])["model"])
    pd.testing.assert_frame_equal(learning_columns(out), learning_columns(reference[0]))
    summary = summary_results(out)
    assert summary["resumed_from_step"] == stops[-1] and summary["resumes"] == stops


def _last(pattern: re.Pattern, log: str) -> int:
    return [int(m[1]) for m in pattern.finditer(log)][-1]


def test_sigterm_mid_step_in_a_real_process_then_resume(runs, reference):
    """The signal lands while the next step runs: that step is finished, checkpointed, exit 75."""
    step = random.Random(7).randrange(2, 2 * STEPS_PER_EPOCH - 3)
    out, ckpt, config = runs("sigterm_process")
    process = start_trainer(out, config)
    log = signal_at_step(process, step, signal.SIGTERM)
    assert process.returncode == contract.EXIT_RESUMABLE, log
    assert step <= last_step(log) == final(ckpt)["position"]["global_step"]  # the step it was in, no further
    assert main(out, config) == 0
    assert_same_weights(final(ckpt)["model"], final(reference[1])["model"])


def test_sigkill_between_checkpoints_then_resume(runs, reference):
    """Killed without warning: the retry resumes from the last periodic checkpoint and repeats steps."""
    out, ckpt, config = runs("sigkill")
    process = start_trainer(out, config)
    log = signal_at_step(process, 17, signal.SIGKILL)  # after the checkpoint at 15, before 20
    assert process.returncode == -signal.SIGKILL, log
    saved = _last(CHECKPOINT_LINE, log)
    assert saved % 5 == 0 and last_step(log) > saved  # steps after the checkpoint were lost
    assert final(ckpt)["position"]["global_step"] == saved
    assert main(out, config) == 0
    assert_same_weights(final(ckpt)["model"], final(reference[1])["model"])
    assert summary_results(out)["resumed_from_step"] == saved


def test_a_checkpoint_of_another_run_config_is_removed_not_resumed(runs, reference, capsys):
    """An older version of the output must not block the new one: a warning names the checkpoint
    and both config hashes, the run starts from scratch, and, finished, retires its checkpoints."""
    _, reference_ckpt, config = reference
    out, ckpt, _ = runs("other_config")
    shutil.copytree(reference_ckpt, ckpt)
    old_name = max(p.name for p in ckpt.glob("ckpt-*.pt"))
    changed = {**config, "lr": 0.1, "checkpoint_dir": str(ckpt), "keep_checkpoints": False, "profile": None}
    assert main(out, changed) == 0
    err = capsys.readouterr().err
    hashes = [provenance.config_hash({**runconfig.DEFAULTS, **run}) for run in (config, changed)]
    assert all(text in err for text in (old_name, *hashes, "lr: 0.05 -> 0.1")), err
    assert summary_results(out)["resumed_from_step"] is None
    # the other run config's newest is set aside (issue 23, item 8); this run's last stays, marked
    # finished (item 5: a retry of the job rewrites the outputs from it)
    kept = sorted(p.relative_to(ckpt).parts[:2] for p in ckpt.rglob("*.pt"))
    assert kept == [(max(p.name for p in ckpt.glob("ckpt-*.pt")),), ("superseded", hashes[0][:16])]
    results = summary_results(out)  # the run catalog shows it
    assert results["superseded_checkpoints"] == [str(p) for p in (ckpt / "superseded").glob("*/*")]


def test_a_finished_run_asked_for_again_measures_anew(runs):
    """Its summary.json deleted, the run is trained again: not resumed from its last checkpoint."""
    out, ckpt, config = runs("again", epochs=1, max_steps_per_epoch=3, eval_max_batches=1)
    assert main(out, config) == 0
    first = json.loads((out / "summary.json").read_text())
    (out / "summary.json").unlink()
    time.sleep(1.1)  # provenance's timestamp counts seconds
    assert main(out, config) == 0
    second = json.loads((out / "summary.json").read_text())
    assert second["results"]["resumed_from_step"] is None and second["results"]["resumes"] == []
    assert second["provenance"]["timestamp"] != first["provenance"]["timestamp"]


def test_a_run_killed_before_writing_its_outputs_resumes_to_write_them(runs):
    """The last epoch's checkpoint is written, then the job dies before its run folder is: the retry
    resumes at the end (training nothing again) and writes the outputs of the measured run."""
    out, ckpt, config = runs("unwritten", epochs=1, max_steps_per_epoch=3, eval_max_batches=1)
    assert main(out, config) == 0
    first = json.loads((out / "summary.json").read_text())
    (out / "summary.json").unlink()
    (ckpt / policy.FINISHED).unlink()  # as if the job had died before finish()
    assert main(out, config) == 0
    second = summary_results(out)
    assert second["resumed_from_step"] == first["results"]["steps"] == 3
    assert second["final_test_acc"] == first["results"]["final_test_acc"]
    assert second["epochs"] == 1


# --- a window in seconds and the start-up, in runs like the reference -------------------------------


def test_a_window_in_seconds_lasts_that_long_in_whole_steps_and_trains_the_same(runs, reference):
    """train.measure.seconds: a window of 2 steps is too short, the window is planned from the
    warm-up's rate with the steps the seconds take; the training (batches, weights) is the
    reference's, bit for bit. The seconds are 3 steps of the reference's fastest interval."""
    seconds = 3 * reference[2]["global_batch"] / summary_results(reference[0])["images_per_s_max"]
    out, ckpt, config = runs("seconds", measure_steps=2, measure_intervals=2, measure_seconds=seconds)
    assert main(out, config) == 0
    r = summary_results(out)
    assert r["window_filled"] and r["measure_seconds"] == seconds and r["measured_s"] >= seconds, r
    assert r["measured_steps"] == r["measure_steps"]
    # planned from the warm-up's rate as it opens, after the warm-up; extended if the steps got faster
    assert r["measure_start_step"] == 4 and r["measure_steps"] >= 2
    assert r["contended"] is False and r["monitor_window_samples"] is None  # no GPU: nothing judged
    assert_same_weights(final(ckpt)["model"], final(reference[1])["model"])


def test_the_summary_reports_the_start_up_to_the_first_steps_end_in_parts(reference):
    """scalestudy.train.startup: run in this process (no launcher), counted from its start."""
    r = summary_results(reference[0])
    parts = r["startup_parts_s"]
    stages = ["imports", "config", "settings", "process_group", "data", "model", "setup", "resume"]
    assert set(parts) == {f"{stage}_s" for stage in [*stages, "first_step"]}, parts
    assert all(seconds >= 0 for seconds in parts.values()) and r["startup_from"] == "process start"
    # the part is a difference of two wall-clock marks (seconds since 1970: about 2.4e-7 s apart)
    assert parts["first_step_s"] == pytest.approx(r["first_step_s"], abs=1e-6)
    assert sum(parts.values()) == pytest.approx(r["startup_s"])
