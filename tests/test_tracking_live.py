"""The live streamer of rank 0 (scalestudy.tracking.live) against an embedded store and an
unreachable server, without training: a job killed and resumed is one MLflow run, its steps once
each, KILLED -> RUNNING -> FINISHED; a failure is FAILED with its reason; a dead server is one
warning and the journal still complete. The trainer's own hooks are tested in test_tracking_train.py."""

from __future__ import annotations

import json
import logging
import socket
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from scalestudy import provenance, tracking
from scalestudy.tracking import live

pytest.importorskip("mlflow")

from scalestudy.tracking import store  # noqa: E402

GIVEN = {"world_size": 2, "per_gpu_batch": 16, "mode": "strong", "nested": {"a": 1}}


def fake_trainer(root: Path, point: str = "scaling/strong-w2_r0", main: bool = True):
    return SimpleNamespace(
        is_main=main,
        given=GIVEN,
        out_dir=root / "results/runs" / point,
        config={"checkpoint_dir": str(root / "ckpt" / point)},
        live=live.NULL_RUN,
    )


@pytest.fixture
def embedded(tmp_path, monkeypatch):
    settings = tracking.settings({"study": {"name": "t"}}, tmp_path)
    for name, value in tracking.to_environ(settings).items():
        monkeypatch.setenv(name, value)
    return settings


def attempt(trainer, steps, code, epochs=()):
    with live.follow(trainer) as run:
        for step in steps:
            run.step(step, {"samples_per_s": 100.0 + step, "train_loss_running": 1.0 / (step + 1)})
        for epoch in epochs:
            run.epoch(epoch, {"test_acc": 0.1 * epoch, "epoch_time_s": 9.0})
        run.ended(code)
    return run


def the_run(settings, point="scaling/strong-w2_r0"):
    client = store.client(settings)
    runs = store.find_runs(client, store.experiment_id(client, settings), point)
    assert len(runs) == 1, [r.info.run_id for r in runs]
    return client, runs[0]


def test_a_killed_and_resumed_job_is_one_run_with_every_step_once(embedded, tmp_path):
    trainer = fake_trainer(tmp_path)
    first = attempt(trainer, range(0, 8), 75, epochs=[1])
    assert not first.warned
    client, run = the_run(embedded)
    assert run.info.status == "KILLED"
    record = json.loads((tmp_path / "ckpt/scaling/strong-w2_r0" / tracking.RUN_ID_FILE).read_text())
    assert record["run_id"] == run.info.run_id and record["config_hash"] == provenance.config_hash(GIVEN)
    # the retry re-runs steps 5..7 (its checkpoint was at 5) and goes on to 12
    second = attempt(fake_trainer(tmp_path), range(5, 13), 0, epochs=[2])
    assert second.run_id == run.info.run_id
    client, run = the_run(embedded)
    assert run.info.status == "FINISHED"
    assert run.data.tags[tracking.TAG_HISTORY] == "RUNNING,KILLED,RUNNING,FINISHED"
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "samples_per_s")]
    assert sorted(steps) == list(range(13))
    epochs = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "epoch_test_acc")}
    assert epochs == pytest.approx({1: 0.1, 2: 0.2})
    assert "epoch_epoch_time_s" not in run.data.metrics  # only metrics.csv's learning columns
    assert run.data.params["nested.a"] == "1" and run.data.tags["world_size"] == "2"
    journal = (trainer.out_dir / tracking.JOURNAL).read_text().splitlines()
    assert len([line for line in journal if '"step"' in line]) == 8 + 8  # the run folder keeps all


def test_an_exception_marks_the_run_failed_with_its_reason(embedded, tmp_path):
    with pytest.raises(RuntimeError), live.follow(fake_trainer(tmp_path)) as run:
        run.step(0, {"samples_per_s": 1.0})
        raise RuntimeError("CUDA error: an illegal memory access")
    _, found = the_run(embedded)
    assert found.info.status == "FAILED"
    assert "illegal memory access" in found.data.tags["failure_reason"]


def test_other_ranks_and_tracking_off_stream_nothing(embedded, tmp_path, monkeypatch):
    with live.follow(fake_trainer(tmp_path, main=False)) as run:
        assert run is live.NULL_RUN
    monkeypatch.delenv(tracking.ENV)
    with live.follow(fake_trainer(tmp_path)) as run:
        assert run is live.NULL_RUN
    assert not (tmp_path / "results").exists()


def test_an_unreachable_server_costs_one_warning_and_no_step(tmp_path, monkeypatch, caplog):
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings = tracking.settings({"study": {"name": "t"}, "tracking": {"uri": f"http://127.0.0.1:{port}"}})
    for name, value in tracking.to_environ(settings).items():
        monkeypatch.setenv(name, value)
    trainer = fake_trainer(tmp_path)
    started = time.perf_counter()
    with caplog.at_level(logging.WARNING, logger="scalestudy.tracking"):
        run = attempt(trainer, range(20), 0, epochs=[1, 2])
    assert time.perf_counter() - started < 15
    warnings = [r for r in caplog.records if r.name == "scalestudy.tracking"]
    assert len(warnings) == 1 and f"127.0.0.1:{port}" in warnings[0].getMessage(), warnings
    assert run.warned and not run.thread.is_alive()
    journal = (trainer.out_dir / tracking.JOURNAL).read_text().splitlines()
    assert len(journal) == 20 + 2  # everything is in the run folder for rule track
