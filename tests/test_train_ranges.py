"""Named ranges and the profiling window (the trainer's use of them is in test_train.py)."""

import json

import pytest
import torch

from scalestudy.plan.runconfig import check_profile
from scalestudy.train.ranges import ProfileWindow, named_range


def _steps(window: ProfileWindow, count: int) -> list[bool]:
    """Which of `count` steps ran inside the window."""
    inside = []
    for step in range(count):
        window.step(step)
        with named_range("step"):
            torch.ones(4).sum()
        inside.append(window.active)
    window.close()
    return inside


def test_torch_window_opens_at_start_step_and_closes_after_steps(tmp_path):
    window = ProfileWindow({"tool": "torch", "start_step": 2, "steps": 3}, tmp_path, rank=0, world_size=4)
    assert _steps(window, 8) == [False, False, True, True, True, False, False, False]
    record = json.loads((tmp_path / "profile_window.json").read_text())
    assert record["steps"] == 3 and record["world_size"] == 4 and record["wall_s"] > 0
    assert "step,3," in (tmp_path / "profile_ops.csv").read_text()


def test_a_run_that_ends_inside_the_window_still_writes_it(tmp_path):
    window = ProfileWindow({"tool": "torch", "start_step": 1, "steps": 10}, tmp_path)
    assert _steps(window, 3) == [False, True, True]
    assert (tmp_path / "profile_ops.csv").exists()


def test_only_rank_0_writes(tmp_path):
    window = ProfileWindow({"tool": "torch", "start_step": 0, "steps": 1}, tmp_path, rank=1, world_size=2)
    _steps(window, 2)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU behaviour")
def test_nsys_window_without_cuda_records_only_its_timing(tmp_path):
    window = ProfileWindow({"tool": "nsys", "start_step": 1, "steps": 2}, tmp_path)
    assert _steps(window, 4) == [False, True, True, False]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["profile_window.json"]


@pytest.mark.parametrize("profile", [None, {"tool": "none", "start_step": 0, "steps": 5}, {"tool": None}])
def test_no_tool_means_no_window_and_no_files(tmp_path, profile):
    assert _steps(ProfileWindow(profile, tmp_path), 3) == [False, False, False]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("profile", "message"),
    [
        ({"tool": "ncu", "start_step": 1, "steps": 1}, "tool='ncu'"),
        ({"tool": "auto", "start_step": 1, "steps": 1}, "resolves 'auto'"),
        ({"tool": "torch", "start_step": -1, "steps": 1}, "start_step >= 0"),
        ({"tool": "torch", "start_step": 1}, "steps >= 1"),
    ],
)
def test_bad_profile_sections_are_named(profile, message):
    with pytest.raises(ValueError, match=message):
        check_profile(profile)


def test_nvtx_ranges_are_process_wide_start_end_ranges(monkeypatch):
    """On a GPU every named range is an NVTX start/end range (the process's), not a push/pop range
    (the calling thread's): autograd launches the backward and its collectives from its own device
    thread, which a push/pop `step` on the main thread does not cover (ncu's `step/` filter)."""
    from scalestudy.train import ranges

    calls = []
    handles = iter(range(100, 200))

    def start(name):
        calls.append(("start", name))
        return next(handles)

    monkeypatch.setattr(ranges, "_cuda_available", lambda: True)
    monkeypatch.setattr(torch.cuda.nvtx, "range_start", start)
    monkeypatch.setattr(torch.cuda.nvtx, "range_end", lambda handle: calls.append(("end", handle)))
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda name: calls.append(("push", name)))
    monkeypatch.setattr(torch.cuda.nvtx, "range_pop", lambda: calls.append(("pop",)))
    with named_range("step"):
        with named_range("forward"):
            pass
        with pytest.raises(RuntimeError), named_range("backward"):
            raise RuntimeError("a failing phase still ends its range")
    assert calls == [
        ("start", "step"),
        ("start", "forward"),
        ("end", 101),
        ("start", "backward"),
        ("end", 102),
        ("end", 100),
    ]
