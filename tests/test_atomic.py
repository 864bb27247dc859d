"""Atomic outputs: nothing half-written is ever visible, and a failure keeps the old file."""

import pytest

from scalestudy import atomic


def test_failure_keeps_the_previous_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "out.json"
    atomic.write_json(target, {"version": 1})
    with pytest.raises(RuntimeError), atomic.atomic_path(target) as tmp:
        tmp.write_text("partial")
        raise RuntimeError("crash while writing")
    assert target.read_text().strip().startswith("{") and '"version": 1' in target.read_text()
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_suffix_is_kept_for_writers_that_infer_the_format(tmp_path):
    with atomic.atomic_path(tmp_path / "fig.png", suffix=".png") as tmp:
        assert tmp.name.endswith(".png")
        tmp.write_bytes(b"x")
    assert (tmp_path / "fig.png").read_bytes() == b"x"


def test_outputs_get_the_umask_mode_not_mkstemps_private_one(tmp_path):
    import os

    old = os.umask(0o022)
    try:
        atomic.write_text(tmp_path / "shared.txt", "x")
    finally:
        os.umask(old)
    assert (tmp_path / "shared.txt").stat().st_mode & 0o777 == 0o644
