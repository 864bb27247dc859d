"""The torch.profiler fallback end to end: a real CPU capture of a tiny conv net -> the schema."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from scalestudy.profiling import parse_torch  # noqa: E402
from scalestudy.profiling.breakdown import breakdown_rows, overlap_row  # noqa: E402
from scalestudy.profiling.schema import CATEGORIES  # noqa: E402

try:
    from scalestudy.train.ranges import ProfileWindow, named_range
except ImportError:  # the trainer's ranges module not there: the same ranges by hand
    ProfileWindow = None
    named_range = torch.profiler.record_function


def tiny_net() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1, bias=False),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.Conv2d(8, 8, 3, padding=1, bias=False),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(8, 10),
    )


def train_step(model, optimizer, images, labels) -> None:
    with named_range("step"):
        with named_range("data"):
            batch = images.flip(3).contiguous()  # augmentation: copies/elementwise in the data range
        with named_range("forward"):
            loss = torch.nn.functional.cross_entropy(model(batch), labels)
        with named_range("backward"):
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
        with named_range("optimizer"):
            optimizer.step()


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    """profile_ops.csv + profile_window.json of 3 profiled CPU steps after 1 warm-up step."""
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("torch_capture")
    model = tiny_net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    images, labels = torch.randn(16, 3, 16, 16), torch.randint(0, 10, (16,))
    profile = {"tool": "torch", "start_step": 1, "steps": 3}
    if ProfileWindow is not None:
        window = ProfileWindow(profile, out, rank=0, world_size=1)
        for step in range(5):
            window.step(step)
            train_step(model, optimizer, images, labels)
        window.close()
    else:
        _capture_by_hand(model, optimizer, images, labels, out, profile)
    return out


def _capture_by_hand(model, optimizer, images, labels, out, profile) -> None:
    import json
    import time

    train_step(model, optimizer, images, labels)
    started = time.perf_counter()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(profile["steps"]):
            train_step(model, optimizer, images, labels)
    wall_s = time.perf_counter() - started
    lines = ["name,count,self_cpu_us,cpu_total_us,self_device_us,device_total_us"]
    for event in prof.key_averages():
        name = event.key.replace('"', "'")
        lines.append(
            f'"{name}",{event.count},{event.self_cpu_time_total},{event.cpu_time_total},'
            f"{event.self_device_time_total},{event.device_time_total}"
        )
    (out / "profile_ops.csv").write_text("\n".join(lines) + "\n")
    (out / "profile_window.json").write_text(json.dumps({**profile, "wall_s": wall_s}))


def test_real_capture_parses_into_the_schema(captured):
    ((totals, labels, top),) = parse_torch.summarize(captured, world_size=1, top=10)
    rows = breakdown_rows(totals, labels)
    assert [row["category"] for row in rows] == list(CATEGORIES)
    assert sum(row["fraction"] for row in rows) == pytest.approx(1.0)
    fractions = {row["category"]: row["fraction"] for row in rows}
    assert fractions["conv_gemm"] > 0.05, fractions
    assert fractions["norm_elementwise"] > 0, fractions
    assert fractions["data_loading"] > 0, fractions
    assert fractions["communication"] == 0.0  # one process, no collectives
    assert labels.tool == "torch" and labels.method == "torch_cpu" and totals.steps == 3
    assert overlap_row(totals, labels)["communication_s"] == 0.0


def test_real_capture_top_ops_are_named_ops_not_ranges(captured):
    ((_, _, top),) = parse_torch.summarize(captured, world_size=1, top=10)
    names = [row["name"] for row in top]
    assert not {"step", "data", "forward", "backward", "optimizer"} & set(names)
    assert any(row["category"] == "conv_gemm" for row in top), names
    assert sum(row["fraction_of_busy"] for row in top) <= 1.0 + 1e-9
