"""Live tracking without training: rank 0's journal (scalestudy.train.journal) and the study's
follower (scalestudy.tracking.follow) that replays it into an embedded store or a server. A job
killed and resumed is one MLflow run, its steps once each, KILLED -> RUNNING -> FINISHED; a failure
is FAILED with its reason; a replay twice adds nothing; the follower process shows a job RUNNING
while it runs, stops with its parent or when stopped, and an unreachable server costs it one
warning while the journal stays complete. The trainer's own hooks: test_tracking_train.py."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from scalestudy import provenance, tracking
from scalestudy.train import journal as job_journal

pytest.importorskip("mlflow")

from scalestudy.tracking import follow, store  # noqa: E402
from tests.tracking_runs import wait_for

GIVEN = {"world_size": 2, "per_gpu_batch": 16, "mode": "strong", "nested": {"a": 1}}
POINT = "scaling/strong-w2_r0"


def fake_trainer(root: Path, point: str = POINT, main: bool = True):
    return SimpleNamespace(
        is_main=main,
        given=GIVEN,
        out_dir=root / "results/runs" / point,
        config={"checkpoint_dir": str(root / "ckpt" / point)},
        live=job_journal.NULL_RUN,
    )


@pytest.fixture
def embedded(tmp_path, monkeypatch):
    settings = tracking.settings({"study": {"name": "t"}}, tmp_path)
    for name, value in tracking.to_environ(settings).items():
        monkeypatch.setenv(name, value)
    return settings


def attempt(trainer, steps, code, epochs=(), slurm_job="100"):
    os.environ["SLURM_JOB_ID"] = slurm_job
    try:
        with job_journal.follow(trainer) as run:
            for step in steps:
                run.step(step, {"samples_per_s": 100.0 + step, "train_loss_running": 1.0 / (step + 1)})
            for epoch in epochs:
                run.epoch(epoch, {"train_loss": 0.5, "test_acc": 0.1 * epoch, "epoch_time_s": 9.0})
            run.ended(code)
    finally:
        del os.environ["SLURM_JOB_ID"]
    return run


def replayer(settings) -> follow.Replayer:
    client = store.client(settings)
    experiment = store.experiment_id(client, settings)
    return follow.Replayer(client, experiment, store.study_run(client, experiment, "t"), settings)


def replay(settings, trainer) -> int:
    """What the follower does for one journal (a new Replayer: as after a follower restart)."""
    return replayer(settings).replay(trainer.out_dir, follow.journal_records(trainer.out_dir))


def the_run(settings, point=POINT):
    client = store.client(settings)
    runs = store.find_runs(client, store.experiment_id(client, settings), point)
    assert len(runs) == 1, [r.info.run_id for r in runs]
    return client, runs[0]


def test_a_killed_and_resumed_job_is_one_run_with_every_step_once(embedded, tmp_path):
    trainer = fake_trainer(tmp_path)
    attempt(trainer, range(0, 8), 75, epochs=[1], slurm_job="100")
    assert replay(embedded, trainer) == 1 + 8 + 1 + 1
    client, run = the_run(embedded)
    assert run.info.status == "KILLED"
    record = json.loads((tmp_path / "ckpt" / POINT / tracking.RUN_ID_FILE).read_text())
    assert record["run_id"] == run.info.run_id and record["config_hash"] == provenance.config_hash(GIVEN)
    # the retry re-runs steps 5..7 (its checkpoint was at 5) and goes on to 12; epoch 1 again too
    attempt(fake_trainer(tmp_path), range(5, 13), 0, epochs=[1, 2], slurm_job="101")
    assert replay(embedded, trainer) == 1 + 8 + 2 + 1  # only the second attempt's records
    assert replay(embedded, trainer) == 0  # a replay twice adds nothing
    client, run = the_run(embedded)
    assert run.info.status == "FINISHED"
    assert run.data.tags[tracking.TAG_HISTORY] == "RUNNING,KILLED,RUNNING,FINISHED"
    assert run.data.tags["slurm.job_ids"] == "100,101"
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "samples_per_s")]
    assert sorted(steps) == list(range(13))
    epochs = [
        (m.step, round(m.value, 6)) for m in client.get_metric_history(run.info.run_id, "epoch_test_acc")
    ]
    assert sorted(epochs) == [(1, 0.1), (2, 0.2)]  # epoch 1 once
    assert "epoch_epoch_time_s" not in run.data.metrics  # only metrics.csv's learning columns
    assert run.data.params["nested.a"] == "1" and run.data.tags["world_size"] == "2"
    journal = (trainer.out_dir / job_journal.JOURNAL).read_text().splitlines()
    assert len([line for line in journal if '"step"' in line]) == 8 + 8  # the run folder keeps all


def test_an_exception_marks_the_run_failed_with_its_reason(embedded, tmp_path):
    trainer = fake_trainer(tmp_path)
    with pytest.raises(RuntimeError), job_journal.follow(trainer) as run:
        run.step(0, {"samples_per_s": 1.0})
        raise RuntimeError("CUDA error: an illegal memory access")
    replay(embedded, trainer)
    _, found = the_run(embedded)
    assert found.info.status == "FAILED"
    assert "illegal memory access" in found.data.tags["failure_reason"]


def test_other_ranks_and_tracking_off_journal_nothing(embedded, tmp_path, monkeypatch):
    with job_journal.follow(fake_trainer(tmp_path, main=False)) as run:
        assert run is job_journal.NULL_RUN
    monkeypatch.delenv(tracking.ENV)
    with job_journal.follow(fake_trainer(tmp_path)) as run:
        assert run is job_journal.NULL_RUN
    assert not (tmp_path / "results").exists()


def test_a_line_cut_by_a_killed_job_waits_for_its_end(tmp_path):
    path = tmp_path / job_journal.JOURNAL
    path.write_text('{"kind": "step", "config_hash": "h", "at": [1, {}, 0]}\n{"kind": "st')
    reader = follow.Follower({}, [tmp_path], None, None)
    assert [r["at"][0] for r in reader._read(path)] == [1]
    with open(path, "a") as handle:
        handle.write('ep", "config_hash": "h", "at": [2, {}, 0]}\n')
    assert [r["at"][0] for r in reader._read(path)] == [2]


# --- the follower as a process --------------------------------------------------------------------


def status_of(settings, point=POINT) -> str | None:
    client = store.client(settings)
    runs = store.find_runs(client, store.experiment_id(client, settings), point)
    return runs[0].info.status if runs else None


def test_the_follower_shows_the_grid_and_a_job_live_and_drains_when_stopped(embedded, tmp_path):
    logs = tmp_path / "results/logs/tracking"
    points = [{"point": POINT, "run": GIVEN}, {"point": "baseline/default", "run": {"world_size": 1}}]
    pid = tracking.start_follower(embedded, logs, [tmp_path / "results/runs"], points)
    try:
        # MLflow creates a run RUNNING; the follower then marks it SCHEDULED (a loaded machine shows
        # the first state for a moment): each point's run becomes SCHEDULED before any job starts
        assert wait_for(lambda: status_of(embedded, "baseline/default") == "SCHEDULED")
        assert wait_for(lambda: status_of(embedded) == "SCHEDULED")
        trainer = fake_trainer(tmp_path)
        with job_journal.follow(trainer) as run:  # the job runs: RUNNING, its steps arrive while it does
            run.step(1, {"samples_per_s": 5.0})
            assert wait_for(lambda: status_of(embedded) == "RUNNING")
            client, found = the_run(embedded)
            assert wait_for(lambda: store.logged_steps(client, found.info.run_id, "samples_per_s")) == {1}
            for step in range(2, 40):
                run.step(step, {"samples_per_s": 5.0})
            run.ended(0)
    finally:
        assert tracking.stop_follower(logs / tracking.FOLLOWER_PID)  # replays what is left, then exits
    assert not (logs / tracking.FOLLOWER_PID).exists() and not tracking._is_follower(pid)
    client, found = the_run(embedded)
    assert found.info.status == "FINISHED"
    assert found.data.tags[tracking.TAG_HISTORY] == "SCHEDULED,RUNNING,FINISHED"
    assert sorted(store.logged_steps(client, found.info.run_id, "samples_per_s")) == list(range(1, 40))
    assert "SCHEDULED run(s) created" in (logs / tracking.FOLLOWER_LOG).read_text()


def test_a_follower_stopped_before_any_journal_appeared_never_opens_the_store(embedded, tmp_path):
    """A short Snakemake run that trains nothing (a table, a fetch): its follower is stopped within
    follow.ATTACH_AFTER_SECONDS with no journal under its roots, and exits at once without importing
    mlflow or creating a run (the points become SCHEDULED in a run that trains)."""
    logs = tmp_path / "results/logs/tracking"
    points = [{"point": POINT, "run": GIVEN}]
    pid = tracking.start_follower(embedded, logs, [tmp_path / "results/runs"], points)
    wait_for(lambda: (logs / tracking.FOLLOWER_PID).is_file())
    time.sleep(1.5 * follow.POLL_SECONDS)  # it has looked for journals at least once
    started = time.monotonic()
    assert tracking.stop_follower(logs / tracking.FOLLOWER_PID)
    assert time.monotonic() - started < 2 and not tracking._is_follower(pid)
    assert not (tmp_path / tracking.EMBEDDED_DB).exists()  # the store was never opened
    assert "nothing to send" in (logs / tracking.FOLLOWER_LOG).read_text()


def test_the_follower_ends_with_its_parent(embedded, tmp_path):
    """Started by a process that then exits (as Snakemake does): it replays what is there and stops."""
    logs, trainer = tmp_path / "logs", fake_trainer(tmp_path)
    attempt(trainer, range(3), 0)
    code = (
        "import json, sys; from scalestudy import tracking;"
        "print(tracking.start_follower(json.loads(sys.argv[1]), sys.argv[2], [sys.argv[3]]))"
    )
    started = subprocess.run(
        [sys.executable, "-c", code, json.dumps(embedded), str(logs), str(tmp_path / "results/runs")],
        capture_output=True,
        text=True,
        check=True,
    )
    pid = int(started.stdout)
    wait_for(lambda: not tracking._is_follower(pid))
    assert status_of(embedded) == "FINISHED" and not (logs / tracking.FOLLOWER_PID).exists()


def test_an_unreachable_server_costs_the_follower_one_warning(tmp_path, monkeypatch):
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings = tracking.settings({"study": {"name": "t"}, "tracking": {"uri": f"http://127.0.0.1:{port}"}})
    for name, value in tracking.to_environ(settings).items():
        monkeypatch.setenv(name, value)
    trainer = fake_trainer(tmp_path)
    command = [sys.executable, "-m", "scalestudy.tracking", "follow", "--tracking-json", json.dumps(settings)]
    command += ["--journals", str(tmp_path / "results/runs"), "--log", str(tmp_path / "follow.log")]
    command += ["--points-json", str(tmp_path / "points.json")]
    (tmp_path / "points.json").write_text(json.dumps([{"point": POINT, "run": GIVEN}]))
    follower = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        started = time.perf_counter()
        attempt(trainer, range(20), 0, epochs=[1, 2])
        assert time.perf_counter() - started < 1  # the job never waits for the server
        wait_for(lambda: "failed" in (tmp_path / "follow.log").read_text())
        time.sleep(2 * follow.POLL_SECONDS)  # journal passes come and go: no second warning
    finally:
        follower.terminate()
    _, errors = follower.communicate(timeout=600)  # at nice 19 on a busy host: see wait_for
    assert follower.returncode == 0
    warnings = [line for line in errors.splitlines() if "WARNING" in line]
    assert len(warnings) == 1 and f"127.0.0.1:{port}" in warnings[0], errors
    journal = (trainer.out_dir / job_journal.JOURNAL).read_text().splitlines()
    assert len(journal) == 1 + 20 + 2 + 1  # everything is in the run folder for rule track


def test_live_off_means_no_journal_and_no_follower(tmp_path, monkeypatch):
    settings = tracking.settings({"study": {"name": "t"}, "tracking": {"live": False}}, tmp_path)
    for name, value in tracking.to_environ(settings).items():
        monkeypatch.setenv(name, value)
    with job_journal.follow(fake_trainer(tmp_path)) as run:
        assert run is job_journal.NULL_RUN
    assert tracking.start_follower(settings, tmp_path / "logs", [tmp_path / "results/runs"]) is None
    assert not (tmp_path / "results").exists() and not (tmp_path / "logs").exists()


def test_a_replaced_journal_is_read_anew_and_the_old_ones_unsent_steps_dropped(embedded, tmp_path):
    """A point re-run from an empty run folder: the follower reads the new journal from its start,
    and the old journal's steps still waiting for their batch are not sent."""
    trainer = fake_trainer(tmp_path)
    follower = follow.Follower(embedded, [tmp_path / "results/runs"], None, None)
    journal = trainer.out_dir / job_journal.JOURNAL
    run = job_journal.JournalRun({"v": 1}, trainer.out_dir, trainer.config["checkpoint_dir"])
    for step in range(1, 4):
        run.step(step, {"samples_per_s": 1.0})
    follower._pass()  # the start record: sent at once, with steps 1 - 3
    for step in range(4, 6):
        run.step(step, {"samples_per_s": 1.0})
    follower._pass()  # steps 4, 5 wait for their batch
    run.close("KILLED")
    journal.unlink()
    job_journal.JournalRun({"v": 2}, trainer.out_dir, trainer.config["checkpoint_dir"] + "-2")
    follower._pass()
    client = store.client(embedded)
    runs = store.find_runs(client, store.experiment_id(client, embedded), POINT)
    by_config = {r.data.tags[tracking.TAG_HASH]: r for r in runs}
    old, new = by_config[provenance.config_hash({"v": 1})], by_config[provenance.config_hash({"v": 2})]
    assert store.logged_steps(client, old.info.run_id, "samples_per_s") == {1, 2, 3}
    assert new.info.status == "RUNNING"
