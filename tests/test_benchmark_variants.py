"""scalestudy.benchmark.variants: the rounds, the time budget, the spread and the ratio's noise (with
a stand-in for the trainer's process), then one real run of two variants on the CPU at a tiny size."""

from __future__ import annotations

import csv
import itertools

import pytest

from scalestudy.benchmark import project, variants


def fake_spawn(rates: dict[str, list[float]], seconds: float, clock: list[float], calls: list[tuple]):
    """project.spawn_fresh's stand-in: the next rate of the run's variant (told by its overrides), a
    run that takes `seconds` of the benchmark's clock."""
    streams = {name: itertools.cycle(values) for name, values in rates.items()}

    def spawn(run: dict, workdir, **_):
        name = "compiled" if run["compile"] else ("foreach" if run.get("optimizer_impl") else "eager")
        calls.append((name, run["per_gpu_batch"]))
        clock[0] += seconds
        results = {
            "images_per_s": next(streams[name]),
            "images_per_s_cv": 0.02,
            "step_time_s": 0.01,
            "compile_s": 20.0 if run["compile"] else None,
            "peak_memory_bytes": 2**30,
            "device_name": "Fake GPU",
            "window_filled": True,
        }
        return project.TrainerRun({"results": results}, {}, seconds)

    return spawn


@pytest.fixture
def stand_in(monkeypatch):
    clock = [0.0]
    calls: list[tuple] = []
    monkeypatch.setattr(variants, "clock", lambda: clock[0])

    def install(rates, seconds):
        monkeypatch.setattr(variants.project, "spawn_fresh", fake_spawn(rates, seconds, clock, calls))
        return calls

    return install


def read(path) -> list[dict]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def test_rounds_interleave_the_cells_and_the_table_gives_spread_ratio_and_noise(stand_in, tmp_path, capsys):
    calls = stand_in({"eager": [100.0, 110.0, 90.0], "compiled": [130.0, 125.0, 135.0]}, seconds=1.0)
    out = tmp_path / "v.csv"
    argv = ["--device", "cpu", "--variants", "eager,compiled", "--batches", "16,32", "--repeats", "3"]
    assert variants.main([*argv, "--out", str(out)]) == 0
    assert calls[:4] == [("eager", 16), ("compiled", 16), ("eager", 32), ("compiled", 32)]  # round 1
    assert len(calls) == 12
    cells = {(row["variant"], row["batch"]): row for row in read(out) if row["kind"] == "cell"}
    eager, compiled = cells[("eager", "16")], cells[("compiled", "16")]
    assert float(eager["mean"]) == pytest.approx(100.0) and float(eager["sd"]) == pytest.approx(10.0)
    assert float(compiled["ratio"]) == pytest.approx(1.3)
    # the relative standard errors of both means (eager 100 +- 10, compiled 130 +- 5, 3 repeats each)
    assert float(compiled["noise"]) == pytest.approx(2 * ((0.1**2 + (5 / 130) ** 2) / 3) ** 0.5, rel=1e-6)
    assert compiled["compile_s"] == "20.0" and eager["compile_s"] == "" and eager["ratio"] == ""
    assert sum(row["kind"] == "sample" for row in read(out)) == 12
    printed = capsys.readouterr().out
    assert "compiled  16     3" in printed
    # docs/guide/benchmarks.md's table
    assert "| compiled | 16 | 130 +- 5 | 3 | 1.300 | 0.124 | Fake GPU |" in printed


def test_no_run_starts_that_would_end_past_the_budget_and_the_table_says_so(stand_in, tmp_path, capsys):
    calls = stand_in({"eager": [100.0], "foreach": [101.0]}, seconds=10.0)
    out = tmp_path / "v.csv"
    argv = ["--device", "cpu", "--variants", "eager,foreach", "--repeats", "3", "--budget-s", "45"]
    assert variants.main([*argv, "--out", str(out)]) == 0
    assert len(calls) == 4  # 4 x 10 s; a fifth would end at 50 s
    printed = capsys.readouterr().out
    assert "not run within --budget-s 45: eager/16 round 3 (~10 s); foreach/16 round 3 (~10 s)" in printed
    cells = [row for row in read(out) if row["kind"] == "cell"]
    assert [row["repeats"] for row in cells] == ["2", "2"]


def test_a_failed_run_is_reported_and_its_cell_not_run_again(stand_in, monkeypatch, tmp_path, capsys):
    stand_in({"eager": [100.0]}, seconds=1.0)
    working = variants.project.spawn_fresh

    def spawn(run, workdir, **options):
        if run["compile"]:
            raise RuntimeError("python -m scalestudy.train exited with 1:\nInductorError: no compiler")
        return working(run, workdir, **options)

    monkeypatch.setattr(variants.project, "spawn_fresh", spawn)
    out = tmp_path / "v.csv"
    argv = ["--device", "cpu", "--variants", "eager,compiled", "--repeats", "2", "--out", str(out)]
    assert variants.main(argv) == 1
    assert "FAILED compiled/16: InductorError: no compiler" in capsys.readouterr().out
    cells = {row["variant"]: row for row in read(out) if row["kind"] == "cell"}
    assert cells["compiled"]["repeats"] == "0" and cells["eager"]["repeats"] == "2"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--variants", "eager,warp"], "--variants: unknown warp"),
        (["--batches", "16,x"], "--batches must be comma-separated integers"),
        (["--repeats", "0"], "--repeats must be at least 1"),
    ],
)
def test_bad_options_are_refused_in_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as stopped:
        variants.parse_args(["--device", "cpu", *argv])
    assert stopped.value.code == 2 and message in capsys.readouterr().err


def test_two_variants_run_for_real_on_the_cpu(tmp_path, capsys):
    """Two fresh trainer processes (ResNet at width 8, batch 16, 1 + 2 steps), the table and the CSV."""
    out = tmp_path / "v.csv"
    argv = ["--device", "cpu", "--variants", "eager,forloop", "--repeats", "1", "--steps", "2"]
    assert variants.main([*argv, "--warmup", "1", "--out", str(out), "--log-level", "WARNING"]) == 0
    cells = {row["variant"]: row for row in read(out) if row["kind"] == "cell"}
    assert float(cells["eager"]["mean"]) > 0 and float(cells["forloop"]["ratio"]) > 0
    assert cells["forloop"]["overrides"] == "compile=False, optimizer_impl=forloop"
    assert cells["eager"]["device_name"]  # the trainer's own record of where it ran


def test_the_captured_step_replays_the_eager_steps_bits_on_the_cpu(tmp_path):
    """scalestudy.benchmark.captured on a CPU (nothing to capture: the same loop eager): from one
    saved state the checked steps give the eager steps' weights bit for bit (the state restored in
    place, as the graph needs), and the timed steps a rate; variant `captured` runs through it."""
    import json

    from scalestudy.benchmark import captured
    from scalestudy.plan.studyconfig import load

    args = variants.parse_args(["--device", "cpu", "--variants", "captured", "--batches", "16"])
    data_dir, images = variants.data_for(args, tmp_path)
    (cell,) = variants.cells(
        args, load(variants.REPO / "config" / "demo.yaml"), data_dir, images, tmp_path / "c"
    )
    out = tmp_path / "captured.json"
    argv = ["--run-config-json", json.dumps(cell.run), "--out", str(out), "--warmup", "2", "--check", "3"]
    assert captured.main([*argv, "--steps", "2"]) == 0
    result = json.loads(out.read_text())["results"]
    assert result["captured"] is False and result["check_error"] == 0.0 and result["check_steps"] == 3
    assert result["images_per_s"] > 0 and result["per_gpu_batch"] == 16
    assert variants.HARNESSES["captured"] is captured.spawn_fresh
