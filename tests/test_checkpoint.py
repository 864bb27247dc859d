"""Checkpoints: round trip, RNG states, pruning, damaged files, config mismatch, kill during write."""

import logging
import multiprocessing
import os
import random
import signal
import time

import numpy as np
import pytest
import torch

from scalestudy import checkpoint


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
    saved = checkpoint.rng_state()
    expected = (random.random(), np.random.rand(), torch.rand(3))
    random.seed(2), np.random.seed(2), torch.manual_seed(2)
    checkpoint.set_rng_state(saved)
    assert (random.random(), np.random.rand()) == expected[:2]
    assert torch.equal(torch.rand(3), expected[2])


def test_rng_states_survive_a_weights_only_save(tmp_path):
    checkpoint.save(tmp_path, {"rng": checkpoint.rng_state()}, 1)
    state, _ = checkpoint.load_latest(tmp_path)
    checkpoint.set_rng_state(state["rng"])


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
    with caplog.at_level(logging.WARNING, logger="scalestudy.checkpoint"):
        state, path = checkpoint.load_latest(tmp_path)
    assert state["step"] == 1
    assert newest.name in caplog.text and "checksum" in caplog.text


def test_a_file_that_matches_its_name_but_does_not_load_is_skipped(tmp_path, caplog):
    checkpoint.save(tmp_path, _state(1), 1)
    junk = b"not a torch file"
    (tmp_path / f"ckpt-000000002-{checkpoint._digest(junk)}.pt").write_bytes(junk)
    with caplog.at_level(logging.WARNING, logger="scalestudy.checkpoint"):
        assert checkpoint.load_latest(tmp_path)[0]["step"] == 1
    assert "does not load" in caplog.text


def test_a_checkpoint_of_another_run_config_is_refused(tmp_path):
    state = {"config_hash": "aaa", "run_config": {"lr": 0.1, "width": 64}}
    checkpoint.check_config(state, "aaa", {"lr": 0.1, "width": 64}, tmp_path / "c.pt")
    with pytest.raises(checkpoint.ConfigMismatch, match=r"lr: 0.1 -> 0.2") as error:
        checkpoint.check_config(state, "bbb", {"lr": 0.2, "width": 64}, tmp_path / "c.pt")
    assert "width" not in str(error.value) and "delete" in str(error.value)


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
