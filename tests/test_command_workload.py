"""The command workload: the user's own script through the runner (scalestudy.workloads.command.runner).

Known answers for the window and the progress file; the contract's Reporter; the runner with tiny
standard-library scripts (errors, checkpoint folder); and the example DDP script end to end with
one rank in this process, two ranks under torchrun over gloo, and SIGTERM -> 75 -> resume.
"""

import hashlib
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest

from scalestudy import contract
from scalestudy.analysis.aggregate import summary_row
from scalestudy.plan.runfiles import METRICS_COLUMNS, STEPS_COLUMNS
from scalestudy.train import program, steady
from scalestudy.workloads.command import runner as command
from scalestudy.workloads.command import support
from scalestudy.workloads.command.progress import ProgressError, read_progress, step_results
from tests.conftest import REPO
from tests.processes import launch_free_environ, without_launch_variables

EXAMPLE = REPO / "examples" / "train_script.py"
WINDOW = {"measure_warmup_steps": 3, "measure_steps": 8, "measure_intervals": 2}


@pytest.fixture(autouse=True)
def _no_launcher(monkeypatch):
    without_launch_variables(monkeypatch)


def _run_config(tmp_path: Path, script, args=(), world_size=1, **changes) -> dict:
    return {
        "workload": "command",
        "stage": "baseline",
        "point": "default",
        "world_size": world_size,
        "per_gpu_batch": 16,
        "global_batch": 16 * world_size,
        "epochs": 2,
        "seed": 3,
        "checkpoint_dir": str(tmp_path / "ckpt"),
        "monitor_interval_s": 0.5,
        "pg_timeout_s": 120,
        **WINDOW,
        "command": {"script": str(script), "args": list(args), "sample_unit": "sequences"},
        **changes,
    }


def _argv(config: dict, out: Path) -> list[str]:
    return ["--run-config-json", json.dumps(config), "--out-dir", str(out)]


def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


# --- the window from reported durations --------------------------------------------------------------


def test_the_window_of_reported_steps_has_the_known_rates_and_the_trainers_keys():
    seconds = [5, 5, 1, 1, 2, 2, 9]  # warm-up 2 steps, then 2 intervals of 2 steps
    ends = [100 + sum(seconds[: i + 1]) for i in range(len(seconds))]
    result = steady.window_of_steps(
        seconds, [8] * 7, 2, 4, 2, world_size=2, start_step=10, end_times=ends, t0=100
    )
    assert result["window_filled"] and result["measured_steps"] == 4 and result["measured_s"] == 6
    assert result["interval_images_per_s"] == [8.0, 4.0]
    assert result["images_per_s"] == pytest.approx(32 / 6) and result[
        "images_per_s_per_gpu"
    ] == pytest.approx(16 / 6)
    assert (result["images_per_s_min"], result["images_per_s_max"], result["step_time_s"]) == (4.0, 8.0, 1.5)
    assert result["images_per_s_cv"] == pytest.approx(statistics.stdev([8, 4]) / 6)
    assert (result["first_step_s"], result["measure_start_step"]) == (5, 12)
    assert (result["measure_start_s"], result["measure_end_s"]) == (10, 16)
    assert result["measure_segments_s"] == [[10, 16]]
    trainer_window = steady.SteadyWindow(2, 4, 2).result(1)
    assert set(result) == set(trainer_window)


def test_a_window_too_short_to_fill_has_no_rates_and_unplaced_times_without_end_times():
    result = steady.window_of_steps([1.0] * 4, [8] * 4, 2, 4, 2, world_size=1)
    assert not result["window_filled"] and result["measured_steps"] == 2
    assert result["images_per_s"] is None and result["measure_start_s"] is None


# --- the progress file -----------------------------------------------------------------------------


def _write_lines(path: Path, *records) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def _steps(first, last, seconds, samples=10):
    return [{"event": "step", "step": k, "samples": samples, "seconds": seconds} for k in range(first, last)]


def test_a_progress_file_over_a_resume_counts_each_step_once_last_occurrence_winning(tmp_path):
    path = _write_lines(
        tmp_path / "p.jsonl",
        {"event": "attempt", "time": 1000.0},
        *_steps(0, 6, 1.0),  # killed after step 5: steps 4 and 5 were never checkpointed
        {"event": "epoch", "epoch": 1, "end_step": 4, "train_loss": 2.0, "test_acc": 0.5},
        {"event": "attempt", "time": 2000.0},
        *_steps(4, 8, 2.0),
        {"event": "epoch", "epoch": 2, "end_step": 8, "train_loss": 1.0, "test_acc": 0.75, "test_loss": 0.9},
        {"event": "memory", "peak_bytes": 123, "source": "cuda_max_memory_allocated"},
        {"event": "exit", "code": 0, "seconds": 20.0},
    )
    config = {"world_size": 2, "global_batch": 10, "per_gpu_batch": 5, "epochs": 2}
    config |= {"measure_warmup_steps": 1, "measure_steps": 2, "measure_intervals": 1}
    results = step_results(read_progress(path), config, t0=None)
    assert results["steps"] == 8 and results["epochs"] == 2 and results["steps_per_epoch"] == 4
    assert results["whole_run_images_per_s"] == pytest.approx(80 / 12)  # 4 x 1 s + 4 x 2 s
    assert results["whole_run_step_time_s"] == pytest.approx(12 / 8)
    assert results["epoch_time_s"] == 8.0  # the median after the first epoch (4 s): epoch 2's 8 s
    assert (results["resumes"], results["resumed_from_step"]) == ([4], 4)
    assert results["total_time_s"] == 6.0 + 20.0  # the cut attempt: its steps' time
    assert results["measure_attempt"] == 1 and results["images_per_s"] == pytest.approx(20 / 4)
    assert (results["final_test_acc"], results["best_test_acc"], results["final_train_loss"]) == (
        0.75,
        0.75,
        1.0,
    )
    assert results["final_test_loss"] == 0.9
    assert command.command_progress.peak_memory(read_progress(path)) == (123, "cuda_max_memory_allocated")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "p.jsonl:2: not a JSON object"),
        ("[1, 2]", 'p.jsonl:2: a progress line must be a JSON object with an "event"'),
        (
            '{"event": "step", "step": 1, "samples": 10, "seconds": 0}',
            'p.jsonl:2: "step" needs seconds a number > 0',
        ),
        ('{"event": "step", "step": -1, "samples": 10, "seconds": 1}', "needs step an integer >= 0, got -1"),
        (
            '{"event": "step", "step": 1, "samples": true, "seconds": 1}',
            "needs samples a number >= 0, got True",
        ),
        ('{"event": "epoch", "epoch": 0}', 'p.jsonl:2: "epoch" needs epoch an integer >= 1'),
        ('{"event": "model", "parameters": 0}', 'p.jsonl:2: "model" needs parameters an integer >= 1'),
    ],
)
def test_a_bad_progress_line_is_named_with_file_and_line(tmp_path, line, message):
    path = _write_lines(tmp_path / "p.jsonl", {"event": "attempt", "time": 1.0}, line)
    with pytest.raises(ProgressError) as raised:
        read_progress(path)
    assert message in str(raised.value)


def test_no_step_line_is_an_error_naming_the_file(tmp_path):
    path = _write_lines(tmp_path / "p.jsonl", {"event": "attempt"}, {"event": "epoch", "epoch": 1})
    with pytest.raises(ProgressError, match='p.jsonl: no "step" line'):
        step_results(read_progress(path), {"world_size": 1}, None)


def test_a_line_cut_by_a_killed_writer_is_dropped_before_the_next_attempt(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"event": "step", "step": 0, "samples": 1, "seconds": 1}\n{"event": "st')
    support.drop_cut_line(path)
    assert path.read_text() == '{"event": "step", "step": 0, "samples": 1, "seconds": 1}\n'


# --- the contract's Reporter ------------------------------------------------------------------------


def test_the_reporter_writes_the_contracts_lines_and_turns_signals_into_a_stop_request(tmp_path):
    (tmp_path / "run.json").write_text(json.dumps({"per_gpu_batch": 4}))
    env = {
        contract.PROGRESS_ENV: str(tmp_path / "p.jsonl"),
        contract.RUN_CONFIG_ENV: str(tmp_path / "run.json"),
        contract.CHECKPOINT_DIR_ENV: str(tmp_path / "ckpt"),
    }
    reporter = contract.Reporter.from_env(env)
    assert reporter.run_config == {"per_gpu_batch": 4} and reporter.checkpoint_dir == tmp_path / "ckpt"
    reporter.next_step = 7  # resumed
    reporter.step(64, 0.5, loss=2.5)
    reporter.step(64, 0.25)
    reporter.epoch(1, test_acc=0.5)
    reporter.memory(1000, "cuda_max_memory_allocated")
    lines = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert [(r["event"], r.get("step")) for r in lines] == [
        ("step", 7),
        ("step", 8),
        ("epoch", None),
        ("memory", None),
    ]
    assert lines[0]["loss"] == 2.5 and "loss" not in lines[1] and abs(lines[0]["time"] - time.time()) < 60
    assert lines[2] == {"event": "epoch", "epoch": 1, "end_step": 9, "test_acc": 0.5}
    progress = read_progress(tmp_path / "p.jsonl")  # what the reporter writes, the runner reads
    assert list(progress.steps) == [7, 8]
    previous = {signum: signal.getsignal(signum) for signum in contract.STOP_SIGNALS}
    try:
        reporter.install_stop_handler()
        assert not reporter.stop_requested
        os.kill(os.getpid(), signal.SIGUSR1)
        assert reporter.stop_requested
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def test_a_reporter_outside_scalestudy_writes_nothing(tmp_path):
    reporter = contract.Reporter.from_env({})
    reporter.step(1, 1.0)
    assert reporter.run_config == {} and reporter.next_step == 1 and not list(tmp_path.iterdir())


# --- the runner with tiny scripts ---------------------------------------------------------------------

FAKE = textwrap.dedent(
    """
    import json, os, sys
    from scalestudy.contract import Reporter
    reporter = Reporter.from_env()
    steps, mode = int(sys.argv[1]), sys.argv[2]
    state = reporter.checkpoint_dir / "state.json"
    reporter.next_step = json.loads(state.read_text())["step"] if state.exists() else 0
    if mode == "bad" or (mode == "bad-on-rank1" and os.environ["RANK"] == "1"):
        open(os.environ["SCALESTUDY_PROGRESS"], "a").write("oops\\n")
    for _ in range(reporter.next_step, steps if mode != "nosteps" else 0):
        reporter.step(reporter.run_config["global_batch"], 0.01)
    reporter.epoch(1, test_loss=1.0)
    state.write_text(json.dumps({"step": steps}))
    sys.exit(3 if mode == "fail" else 0)
    """
)


@pytest.fixture
def fake(tmp_path):
    path = tmp_path / "fake.py"
    path.write_text(FAKE)
    return path


@pytest.mark.parametrize(
    ("mode", "code", "message"),
    [
        ("bad", 2, "progress-rank0.jsonl:2: not a JSON object"),
        ("nosteps", 2, 'no "step" line'),
        ("fail", 3, "script exited with 3"),
    ],
)
def test_a_script_that_fails_or_reports_badly_leaves_no_run_folder(
    tmp_path, fake, capsys, mode, code, message
):
    out = tmp_path / "run"
    assert program.main(_argv(_run_config(tmp_path, fake, ["12", mode]), out)) == code
    assert message in capsys.readouterr().err
    assert not out.exists() or not list(out.iterdir())


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"command": {"script": "missing.py"}}, "command.script missing.py (relative to"),
        ({"command": {"script": "x.py", "args": "--a"}}, "command.args='--a' must be a list of strings"),
        ({"global_batch": 17}, "global_batch=17 is not per_gpu_batch=16 x world_size=1"),
        ({"epochs": 0}, "epochs=0 must be an integer >= 1"),
        ({"world_size": 2, "global_batch": 32}, "world_size=2 but the single environment has 1 ranks"),
        ({"micro_batch": 4}, "micro_batch=4 is ignored by the command workload (gradient accumulation"),
    ],
)
def test_a_bad_run_config_exits_2_naming_the_key_before_anything_runs(
    tmp_path, fake, capsys, change, message
):
    out = tmp_path / "run"
    assert program.main(_argv({**_run_config(tmp_path, fake, ["4", "ok"]), **change}, out)) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "ckpt" / "scalestudy").exists()


def test_a_finished_run_empties_its_checkpoint_dir_and_one_kept_is_measured_anew(tmp_path, fake):
    out = tmp_path / "run"
    config = _run_config(tmp_path, fake, ["12", "ok"], keep_checkpoints=True)
    assert program.main(_argv(config, out)) == 0
    assert (tmp_path / "ckpt" / "state.json").exists()  # kept, marked finished
    assert program.main(_argv(config, out)) == 0  # asked again: the mark empties it first
    results = _summary(out)["results"]
    assert results["steps"] == 12 and results["resumes"] == []
    assert program.main(_argv({**config, "keep_checkpoints": False}, out)) == 0  # another run config
    assert _summary(out)["results"]["steps"] == 12 and not (tmp_path / "ckpt").exists()


# --- the example script ----------------------------------------------------------------------------


def _check_run_folder(out: Path, world_size: int, steps: int) -> dict:
    summary = _summary(out)
    row = summary_row(out / "summary.json")  # the run catalog takes it
    assert (
        row["world_size"] == world_size and row["workload"] == "command" and row["sample_unit"] == "sequences"
    )
    results = summary["results"]
    assert results["steps"] == steps and results["window_filled"] and results["images_per_s"] > 0
    assert (
        0 < results["measure_start_s"] < results["measure_end_s"] < results["total_time_s"] + 1
    )  # on t0's clock
    assert results["sample_unit"] == "sequences" and len(results["peak_memory_bytes_per_rank"]) == world_size
    assert results["peak_memory_bytes"] > 10e6 and results["peak_memory_source"] == "cpu_peak_rss"
    assert 0 < results["final_test_loss"] < 1.4 and results["final_test_acc"] > 0.5  # chance: 0.25
    metrics = pd.read_csv(out / "metrics.csv")
    assert tuple(metrics.columns) == METRICS_COLUMNS and list(metrics["epoch"]) == [1, 2]
    assert metrics["images_per_s"].gt(0).all() and metrics["train_acc"].isna().all()
    assert tuple(pd.read_csv(out / "steps.csv").columns) == STEPS_COLUMNS
    assert json.loads((out / "gpu_monitor.json").read_text())["available"] is False
    prov = summary["provenance"]
    assert prov["script"]["sha256"] == hashlib.sha256(EXAMPLE.read_bytes()).hexdigest()
    assert len(prov["ranks"]) == world_size and prov["config_hash"]
    return summary


EXAMPLE_ARGS = ["--samples", "1024", "--test-samples", "512", "--hidden", "64"]  # 64 global steps per epoch


def test_the_example_script_with_one_rank_makes_a_run_folder_the_catalog_takes(tmp_path):
    out = tmp_path / "run"
    config = _run_config(tmp_path, EXAMPLE, EXAMPLE_ARGS, device="cpu")
    assert program.main(_argv(config, out)) == 0
    summary = _check_run_folder(out, 1, 2 * 1024 // 16)
    assert summary["provenance"]["launcher"] == "single" and not (tmp_path / "ckpt").exists()
    results = summary["results"]  # the example's "model" line: its MLP's size and FLOPs
    assert results["parameters"] > 0 and results["train_flops_per_image"] == 6 * results["parameters"]


def test_a_model_line_gives_the_parameters_and_flops_under_the_trainers_keys():
    assert support.model_results({"parameters": 10, "train_flops_per_sample": 60.0}) == {
        "parameters": 10,
        "train_flops_per_image": 60.0,
        "forward_flops_per_image": 20.0,
    }
    assert support.model_results({}) == {}


def _env() -> dict[str, str]:
    env = launch_free_environ()
    return {**env, "OMP_NUM_THREADS": "1"}


def test_the_example_script_with_two_ranks_under_torchrun(tmp_path):
    out = tmp_path / "run"
    config = _run_config(tmp_path, EXAMPLE, EXAMPLE_ARGS, world_size=2, device="cpu")
    runner = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    runner += ["-m", "scalestudy.train", *_argv(config, out)]
    result = subprocess.run(runner, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-5000:]
    summary = _check_run_folder(out, 2, 2 * 1024 // 32)
    assert summary["provenance"]["launcher"] == "torchrun" and summary["results"]["global_batch"] == 32


def _progress_steps(path: Path) -> int:
    text = path.read_text() if path.exists() else ""
    return text.count('"event": "step"')


def _start(runner: list[str]) -> subprocess.Popen:
    return subprocess.Popen(runner, cwd=REPO, env=_env(), stderr=subprocess.PIPE, text=True)


def _highest_step(path: Path) -> int:
    """The highest step reported so far (a resumed attempt reports some steps again)."""
    text = path.read_text() if path.exists() else ""
    return max(map(int, re.findall(r'"event": "step", "step": (\d+)', text)), default=-1)


def _when_steps_reported(
    process: subprocess.Popen, progress: Path, count: int, measure=_progress_steps
) -> None:
    """Until the run has reported `count` steps or ended; a generous ceiling (a loaded host is slow)."""
    deadline = time.monotonic() + 600
    while measure(progress) < count and process.poll() is None:
        assert time.monotonic() < deadline, f"{measure(progress)} of {count} steps reported in 600 s"
        time.sleep(0.01)


def test_killed_then_stopped_by_sigterm_the_run_resumes_twice_counting_every_step_once(tmp_path):
    """SIGKILL to the runner: the script dies with it; the retry resumes from the last periodic
    checkpoint (the steps after it are reported again). SIGTERM: the script saves and exits 75
    through the runner; the next retry resumes there and finishes."""
    out = tmp_path / "run"
    args = ["--samples", "4096", "--hidden", "512", "--checkpoint-every", "50"]  # 256 steps per epoch
    runner = [sys.executable, "-m", "scalestudy.train"]
    runner += _argv(_run_config(tmp_path, EXAMPLE, args, device="cpu"), out)
    progress = tmp_path / "ckpt" / "scalestudy" / "progress-rank0.jsonl"
    first = _start(runner)
    _when_steps_reported(first, progress, 70)
    first.kill()
    first.communicate(timeout=60)
    killed_at = _progress_steps(progress)
    time.sleep(1.0)
    assert _progress_steps(progress) == killed_at < 512, "the script outlived its runner"
    second = _start(runner)
    _when_steps_reported(second, progress, killed_at + 40, measure=_highest_step)  # past the kill
    second.send_signal(signal.SIGTERM)
    log = second.communicate(timeout=120)[1]
    assert second.returncode == contract.EXIT_RESUMABLE, log[-3000:]
    assert not (out / "summary.json").exists()
    third = subprocess.run(runner, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300)
    assert third.returncode == 0, third.stderr[-3000:]
    results = _summary(out)["results"]
    resumed, stopped = results["resumes"]
    # its checkpoints: every 50 steps and at the end of the first epoch (256 steps), where a kill that
    # lands after that epoch's end resumes
    assert (resumed % 50 == 0 or resumed == 256) and 50 <= resumed < killed_at < stopped < 512
    assert results["resumed_from_step"] == stopped and f"resumed at step {stopped}" in third.stderr
    assert results["steps"] == 512  # reported: 512 + killed_at - resumed
    assert results["epochs"] == 2 and results["window_filled"] and math.isfinite(results["total_time_s"])


def test_the_ranks_of_one_launch_share_a_report_folder_name_and_the_next_launch_gets_another():
    assert support.launch_id({"TORCHELASTIC_RUN_ID": "ab/c"}, "h") == "torchrun-ab_c"
    assert support.launch_id({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "2"}, "h") == "slurm-7.2"
    by_hand = {"MASTER_ADDR": "n1", "MASTER_PORT": "29500", "SCALESTUDY_ATTEMPT": "2"}
    assert support.launch_id(by_hand, "h") == "n1-29500-2-h"


def test_a_ranks_monitor_rows_are_moved_onto_rank_0s_clock():
    report = {"rank": 1, "rows": [[0.5, "host", 0], [1.5, "host", 0]]}
    assert [row[0] for row in support.rebased(report, 2.0)["rows"]] == [2.5, 3.5]
    # so are the sightings of a foreign process on its GPU (the window is on rank 0's clock)
    span = {"pid": 9, "first_s": 0.5, "last_s": 1.5, "samples": 2}
    report["gpus"] = [
        {"uuid": "GPU-a", "processes": {"foreign": [span]}},
        {"uuid": "GPU-b", "processes": None},
    ]
    gpus = support.rebased(report, 2.0)["gpus"]
    assert gpus[0]["processes"]["foreign"] == [{**span, "first_s": 2.5, "last_s": 3.5}]
    assert gpus[1]["processes"] is None


def test_a_bad_line_on_another_rank_fails_the_run_through_rank_0(tmp_path, fake):
    """The ranks share no process group: rank 1's report (in checkpoint_dir) carries its error."""
    out = tmp_path / "run"
    config = _run_config(tmp_path, fake, ["12", "bad-on-rank1"], world_size=2)
    runner = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    runner += ["-m", "scalestudy.train", *_argv(config, out)]
    result = subprocess.run(runner, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode != 0 and "rank 1: exit code 0 " in result.stderr, result.stderr[-3000:]
    assert "progress-rank1.jsonl:2: not a JSON object" in result.stderr
    assert not out.exists() or not list(out.iterdir())


def test_another_run_configs_checkpoint_dir_is_set_aside_not_deleted(tmp_path, fake, capsys):
    """Issue 23, item 8: a checkpoint_dir left by another run config (a typo, two runs in one folder)
    is moved into superseded/<its hash>/, one kept per run config; the run starts from scratch."""
    ckpt = tmp_path / "ckpt"
    (ckpt / command.STATE_DIR).mkdir(parents=True)
    (ckpt / command.STATE_DIR / command.RUN_MARK).write_text(
        json.dumps({"config_hash": "0123456789abcdef99"})
    )
    (ckpt / "state.json").write_text(json.dumps({"step": 5}))  # the other run's checkpoint
    out = tmp_path / "run"
    assert program.main(_argv(_run_config(tmp_path, fake, ["12", "ok"]), out)) == 0
    kept = ckpt / support.SUPERSEDED / "0123456789abcdef"
    assert json.loads((kept / "state.json").read_text()) == {"step": 5}
    assert f"set aside as {kept}" in capsys.readouterr().err
    assert _summary(out)["results"]["steps"] == 12 and _summary(out)["results"]["resumes"] == []
    assert _summary(out)["results"]["superseded_checkpoints"] == [str(kept)]  # in the run catalog
    assert summary_row(out / "summary.json")["superseded_checkpoints"] == json.dumps([str(kept)])
    assert sorted(p.name for p in ckpt.iterdir()) == [support.SUPERSEDED]  # finished: the rest emptied
