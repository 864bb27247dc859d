"""Checkpoints: round trip, RNG states, pruning, damaged files, which one a run may claim, retiring,
kill during write."""

import logging
import multiprocessing
import os
import random
import signal
import time

import numpy as np
import pytest
import torch

from scalestudy.train.checkpoint import policy
from scalestudy.train.checkpoint import single_file as checkpoint


def _state(step: int, size: int = 1000) -> dict:
    return {"step": step, "weights": torch.full((size,), float(step)), "config_hash": "abc", "run_config": {}}


def _files(folder):
    return sorted(p.name for p in folder.iterdir())


def test_round_trip_of_the_newest(tmp_path):
    for step in (5, 10):
        checkpoint.save(tmp_path, _state(step), step)
    state, path = checkpoint.load_latest(tmp_path)
    assert state["step"] == 10 and torch.equal(state["weights"], torch.full((1000,), 10.0))
    assert path.name.startswith("ckpt-000000010-")


def test_nothing_to_resume_from(tmp_path):
    assert checkpoint.load_latest(tmp_path) is None
    assert checkpoint.load_latest(tmp_path / "missing") is None


def test_rng_states_come_back():
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    saved = policy.rng_state()
    expected = (random.random(), np.random.rand(), torch.rand(3))
    random.seed(2), np.random.seed(2), torch.manual_seed(2)
    policy.set_rng_state(saved)
    assert (random.random(), np.random.rand()) == expected[:2]
    assert torch.equal(torch.rand(3), expected[2])


def test_rng_states_survive_a_weights_only_save(tmp_path):
    checkpoint.save(tmp_path, {"rng": policy.rng_state()}, 1)
    state, _ = checkpoint.load_latest(tmp_path)
    policy.set_rng_state(state["rng"])


def test_only_the_newest_two_are_kept_and_leftover_temp_files_go(tmp_path):
    (tmp_path / ".ckpt-000000001-0000000000000000.pt.x1y2.tmp").write_bytes(b"partial")
    for step in range(1, 5):
        checkpoint.save(tmp_path, _state(step), step)
    assert [name[:14] for name in _files(tmp_path)] == ["ckpt-000000003", "ckpt-000000004"]


def test_rewriting_a_step_replaces_the_old_file(tmp_path):
    """A retried run saves the epoch end at the step its signal checkpoint had: one file per step."""
    checkpoint.save(tmp_path, _state(3), 3)
    checkpoint.save(tmp_path, _state(6), 6)
    newest = checkpoint.save(tmp_path, {**_state(6), "epoch_end": True}, 6)
    assert _files(tmp_path) == sorted(["ckpt-000000003-" + _files(tmp_path)[0][15:], newest.name])
    assert checkpoint.load_latest(tmp_path)[0]["epoch_end"]


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_damaged_newest_file_is_skipped_with_a_warning(tmp_path, caplog, damage):
    checkpoint.save(tmp_path, _state(1), 1)
    newest = checkpoint.save(tmp_path, _state(2), 2)
    data = bytearray(newest.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0xFF
    else:
        data = data[: len(data) // 2]
    newest.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="scalestudy.train.checkpoint.single_file"):
        state, path = checkpoint.load_latest(tmp_path)
    assert state["step"] == 1
    assert newest.name in caplog.text and "checksum" in caplog.text


def test_a_file_that_matches_its_name_but_does_not_load_is_skipped(tmp_path, caplog):
    checkpoint.save(tmp_path, _state(1), 1)
    junk = b"not a torch file"
    (tmp_path / f"ckpt-000000002-{checkpoint._digest(junk)}.pt").write_bytes(junk)
    with caplog.at_level(logging.WARNING, logger="scalestudy.train.checkpoint.single_file"):
        assert checkpoint.load_latest(tmp_path)[0]["step"] == 1
    assert "does not load" in caplog.text


def _run_state(step: int, epoch: int, config_hash: str = "abc", lr: float = 0.1) -> dict:
    position = {"epoch": epoch, "step": 0, "global_step": step}
    return {**_state(step), "config_hash": config_hash, "run_config": {"lr": lr}, "position": position}


def test_an_interrupted_run_of_the_same_config_is_resumed(tmp_path):
    checkpoint.save(tmp_path, _run_state(5, epoch=0), 5)
    checkpoint.save(tmp_path, _run_state(10, epoch=1), 10)
    state, path = checkpoint.claim(tmp_path, "abc", epochs=2)
    assert state["step"] == 10 and path.exists() and len(_files(tmp_path)) == 2


def test_a_checkpoint_of_another_run_config_is_set_aside_with_a_warning(tmp_path, caplog):
    """An older version of the output, a typo, two runs in one folder: never resumed, never blocking,
    never deleted: the newest of each other run config is kept under superseded/<hash>/; both
    hashes are named (issue 23, item 8)."""
    folder = tmp_path / "ckpt"
    checkpoint.save(folder, _run_state(5, epoch=0, config_hash="old1"), 5)
    newest = checkpoint.save(folder, _run_state(10, epoch=1, config_hash="old1"), 10)
    (folder / ".ckpt-000000011-0000000000000000.pt.x.tmp").write_bytes(b"partial")
    with caplog.at_level(logging.WARNING, logger="scalestudy.train.checkpoint.single_file"):
        assert checkpoint.claim(folder, "new2", epochs=2, config={"lr": 0.2}) is None
    kept = folder / policy.SUPERSEDED / "old1" / newest.name
    assert [p.relative_to(folder) for p in sorted(folder.rglob("*")) if p.is_file()] == [
        kept.relative_to(folder)
    ]
    assert checkpoint.load_latest(kept.parent)[0]["step"] == 10  # whole, resumable by hand
    assert all(text in caplog.text for text in (newest.name, "old1", "new2", "lr: 0.1 -> 0.2", str(kept)))
    checkpoint.save(folder, _run_state(3, epoch=0, config_hash="new2"), 3)  # this run goes on beside it
    assert checkpoint.claim(folder, "new2", epochs=2)[0]["step"] == 3
    assert checkpoint.claim(folder, "new3", epochs=2) is None  # a third run config: both kept
    assert sorted(p.name for p in (folder / policy.SUPERSEDED).iterdir()) == ["new2", "old1"]


def test_the_end_of_a_finished_run_is_not_resumed(tmp_path, caplog):
    """A finished run whose checkpoints were kept (marked finished) asked for again measures anew."""
    folder = tmp_path / "ckpt"
    checkpoint.save(folder, _run_state(10, epoch=1), 10)
    last = checkpoint.save(folder, _run_state(20, epoch=2), 20)
    checkpoint.finished(folder, "abc", keep=True)
    assert {path.name for path in folder.iterdir()} >= {last.name, policy.FINISHED}
    with caplog.at_level(logging.WARNING, logger="scalestudy.train.checkpoint.single_file"):
        assert checkpoint.claim(folder, "abc", epochs=2) is None
    assert not folder.exists() and last.name in caplog.text and "finished" in caplog.text


def test_a_finished_run_that_keeps_nothing_keeps_its_last_checkpoint_until_asked_again(tmp_path, monkeypatch):
    """Without keep_checkpoints only the newest stays, marked finished, so that a retry of the job
    (issue 23, item 5) can rewrite the outputs; the run asked for again removes it."""
    folder = tmp_path / "ckpt"
    monkeypatch.setenv("SCALESTUDY_ATTEMPT", "1")
    checkpoint.save(folder, _run_state(10, epoch=1), 10)
    last = checkpoint.save(folder, _run_state(20, epoch=2), 20)
    checkpoint.finished(folder, "abc", keep=False)
    assert sorted(p.name for p in folder.iterdir()) == sorted([last.name, policy.FINISHED])
    assert checkpoint.claim(folder, "abc", epochs=2) is None  # attempt 1 of a new workflow run
    assert not folder.exists()


def test_a_retry_of_the_job_that_finished_the_run_resumes_its_end_to_rewrite_the_outputs(
    tmp_path, monkeypatch, caplog
):
    """Issue 23, item 5: the attempt that wrote the outputs failed afterwards (a stop during the
    final writes); the workflow removed them and retries: the retry resumes the end, no step again."""
    folder = tmp_path / "ckpt"
    monkeypatch.setenv("SCALESTUDY_ATTEMPT", "1")
    last = checkpoint.save(folder, _run_state(20, epoch=2), 20)
    checkpoint.finished(folder, "abc", keep=False)
    monkeypatch.setenv("SCALESTUDY_ATTEMPT", "2")
    with caplog.at_level(logging.WARNING, logger="scalestudy.checkpoint"):
        state, path = checkpoint.claim(folder, "abc", epochs=2)
    assert path == last and state["position"]["epoch"] == 2
    assert "finished in attempt 1, but this is attempt 2 of its job" in caplog.text


def test_a_run_stopped_between_its_last_checkpoint_and_its_outputs_resumes(tmp_path, caplog):
    """The last epoch's checkpoint without the finished mark: the run was killed before (or while)
    writing its run folder. It resumes (no step left) to write its outputs, not to train again."""
    folder = tmp_path / "ckpt"
    last = checkpoint.save(folder, _run_state(20, epoch=2), 20)
    with caplog.at_level(logging.WARNING, logger="scalestudy.train.checkpoint.single_file"):
        state, path = checkpoint.claim(folder, "abc", epochs=2)
    assert path == last and state["position"]["epoch"] == 2 and "never written" in caplog.text


def test_a_checkpoint_of_an_earlier_format_is_never_resumed(tmp_path, monkeypatch):
    folder = tmp_path / "ckpt"
    monkeypatch.setattr(checkpoint, "FORMAT", checkpoint.FORMAT - 1)
    checkpoint.save(folder, _run_state(10, epoch=1), 10)
    monkeypatch.undo()
    assert checkpoint.claim(folder, "abc", epochs=2) is None
    assert not folder.exists()


def test_files_none_of_which_loads_are_removed(tmp_path):
    junk = b"not a torch file"
    (tmp_path / f"ckpt-000000002-{checkpoint._digest(junk)}.pt").write_bytes(junk)
    (tmp_path / "notes.txt").write_text("the user's")
    assert checkpoint.claim(tmp_path, "abc", epochs=2) is None
    assert _files(tmp_path) == ["notes.txt"]
    assert checkpoint.claim(tmp_path / "missing", "abc", epochs=2) is None


def test_retire_removes_only_checkpoint_files(tmp_path):
    for step in (1, 2):
        checkpoint.save(tmp_path, _state(step), step)
    (tmp_path / "notes.txt").write_text("the user's")
    assert checkpoint.retire(tmp_path) == 2
    assert _files(tmp_path) == ["notes.txt"]
    assert checkpoint.retire(tmp_path / "missing") == 0


# --- killed while writing -----------------------------------------------------------------------------

PAYLOAD = 2_000_000  # floats: 8 MB, so a write takes long enough to be hit


def _write_forever(folder: str) -> None:
    torch.set_num_threads(1)  # a forked child must not enter the parent's OpenMP pool
    step = 0
    while True:
        step += 1
        checkpoint.save(folder, _state(step, PAYLOAD), step)


def _check_loads_right(folder) -> int:
    found = checkpoint.load_latest(folder)
    if found is None:
        return 0
    state, path = found
    assert path.name.startswith(f"ckpt-{state['step']:09d}-")
    assert torch.equal(state["weights"], torch.full((PAYLOAD,), float(state["step"])))
    return state["step"]


def _wait_for(condition, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the writer made no progress"
        time.sleep(0.0005)


@pytest.mark.parametrize("when", ["random", "mid-write"])
def test_a_kill_during_writing_never_leaves_a_checkpoint_that_loads_wrong(tmp_path, when):
    """SIGKILL the writer at random times, or exactly while a temp file is being written."""
    context = multiprocessing.get_context("fork")  # torch is already imported: a cheap child
    rng = random.Random(0)
    hit_mid_write = 0
    for trial in range(4):
        folder = tmp_path / f"trial{trial}"
        folder.mkdir()
        writer = context.Process(target=_write_forever, args=(str(folder),), daemon=True)
        writer.start()
        _wait_for(lambda folder=folder: any(folder.glob("ckpt-*")))
        if when == "random":
            time.sleep(rng.uniform(0, 0.5))
        else:
            _wait_for(lambda folder=folder: any(folder.glob(".ckpt-*.tmp*")))
        os.kill(writer.pid, signal.SIGKILL)
        writer.join()
        hit_mid_write += any(folder.glob(".ckpt-*.tmp*"))
        assert _check_loads_right(folder) >= 1
    if when == "mid-write":
        assert hit_mid_write == 4
