"""The one-GPU study's verdicts (scalestudy.benchmark.studycheck) on constructed result folders: one
that passes, and one each with an overlap, a contended point, no convolution kernels in the ncu
table, a benchmark at other settings or too far off, a run whose CUDA graphs were skipped; the
project-vs-reference line. The runs' files follow the trainer's layout
(runfiles) and the GPU monitor's process columns of issue 31 (foreign_processes)."""

from __future__ import annotations

import copy
import csv
import datetime as dt
import json
from pathlib import Path

import pytest

from scalestudy.benchmark import project, studycheck
from scalestudy.benchmark.__main__ import parse_run_args
from scalestudy.benchmark.suite import describe_run
from scalestudy.plan import grid, runfiles
from scalestudy.plan.studyconfig import load as study_config
from tests.conftest import REPO

CONFIG = study_config(REPO / "config" / "gpu-one.yaml")
T0 = dt.datetime(2026, 11, 27, 10, 0, 0, tzinfo=dt.UTC).timestamp()
FPROP = "sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64_kernel"
LOADER = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(int, T2, T3)"


def write_csv(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def write_run(results: Path, point: grid.Point, start: float, seconds: float, rate: float, foreign=0) -> None:
    """A finished run of `point` in its run folder (write_run_folder)."""
    folder = results / Path(point.run_dir).relative_to("results")
    write_run_folder(folder, grid.run_config(CONFIG, point), start, seconds, rate, foreign)


def write_run_folder(folder: Path, run: dict, start: float, seconds: float, rate: float, foreign=0) -> None:
    """summary.json ending `seconds` after `start`, and 20 monitor samples (`foreign` processes in 4)."""
    folder.mkdir(parents=True, exist_ok=True)
    end = dt.datetime.fromtimestamp(start + seconds, dt.UTC).isoformat(timespec="seconds")
    summary = {
        "run": run,
        "results": {"images_per_s": rate, "total_time_s": seconds, "window_filled": True},
        "provenance": {"timestamp": end},
    }
    (folder / runfiles.SUMMARY).write_text(json.dumps(summary))
    samples = [
        {
            "time_s": 0.1 * i,
            "gpu_index": 0,
            "gpu_uuid": "GPU-0",
            "sm_active_pct": 60.0,
            "processes": 1 + (foreign if 5 <= i < 9 else 0),
            "foreign_processes": foreign if 5 <= i < 9 else 0,
            "foreign_mem_mb": 3100.0 if foreign and 5 <= i < 9 else 0.0,
        }
        for i in range(20)
    ]
    write_csv(folder / runfiles.GPU_MONITOR, samples)


STRONG = grid.scaling_point(CONFIG, "strong", 1, 0)
POINTS = [grid.baseline_point(CONFIG), STRONG, *grid.sensitivity_points(CONFIG)[:2]]


def benchmark_row(rate: float, **changes) -> dict:
    """The benchmark's trainer row as `python -m scalestudy.benchmark` writes it (settings built by
    its own describe_run) for the strong point's settings, with `changes` on top."""
    run = {**grid.run_config(CONFIG, STRONG), **changes}
    bench_run = project.run_config(
        CONFIG,
        "data",
        "unused",
        precision=run["precision"],
        per_gpu_batch=run["per_gpu_batch"],
        width=run["width"],
        channels_last=run["channels_last"],
        device="cuda",
        epochs=3,
        max_steps_per_epoch=150,
        measure_warmup_steps=150,
        measure_steps=300,
    )
    return {
        "section": "training",
        "name": f"project trainer {run['precision']}",
        "settings": describe_run(bench_run),
        "median": rate,
        "unit": "img/s",
        "repeats": 2,
        "device": "cuda",
        "width": run["width"],
        "batch": run["per_gpu_batch"],
    }


def study(tmp_path: Path, *, strong_rate=44_000.0, bench_rate=45_000.0, gap_s=6.0, kernels=(FPROP, LOADER)):
    """A results folder that passes every check (unless told otherwise) and the benchmark CSV."""
    results = tmp_path / "results"
    start = T0
    for point in POINTS:
        write_run(results, point, start, 12.0, strong_rate if point is STRONG else 20_000.0)
        start += 12.0 + gap_s
    write_csv(
        results / "tables" / "runs.csv",
        [
            {"stage": point.stage, "point": point.name, "contended": False, "contention": ""}
            for point in POINTS
        ],
    )
    profile = results / "profile" / "w1"
    profile.mkdir(parents=True)
    status = {"ran": True, "reason": None, "kernels": len(kernels), "selection": "the top 10 kernels ..."}
    (profile / "ncu_status.json").write_text(json.dumps(status))
    write_csv(
        profile / "ncu_kernels.csv", [{"tool": "ncu", "id": i, "name": n} for i, n in enumerate(kernels)]
    )
    bench = tmp_path / "benchmark.csv"
    write_csv(bench, [benchmark_row(bench_rate)])
    return results, bench


def by_check(results: Path, bench: Path) -> dict[str, studycheck.Verdict]:
    return {verdict.check: verdict for verdict in studycheck.verdicts(results, bench)}


def test_a_clean_study_passes_every_check(tmp_path, capsys):
    results, bench = study(tmp_path)
    found = by_check(results, bench)
    assert all(verdict.passed for verdict in found.values()), found
    assert "4 training runs" in found["no_overlap"].detail
    assert "0.978x" in found["strong_vs_benchmark"].detail  # 44,000 / 45,000
    assert "1 convolution kernels in 2 launches" in found["ncu_convolutions"].detail
    assert studycheck.main(["check", "--results", str(results), "--benchmark", str(bench)]) == 0
    out = capsys.readouterr().out
    assert out.count("PASS  ") == 5 and "study check: all passed" in out


def test_a_foreign_process_on_a_runs_gpu_is_an_overlap(tmp_path, capsys):
    results, bench = study(tmp_path)
    write_run(results, POINTS[2], T0 + 2 * 18.0, 12.0, 20_000.0, foreign=1)
    verdict = by_check(results, bench)["no_overlap"]
    assert not verdict.passed
    assert "runs/sensitivity/tf32/bs256: 4 samples with up to 1 foreign processes" in verdict.detail
    assert studycheck.main(["check", "--results", str(results), "--benchmark", str(bench)]) == 1
    assert "FAIL  no_overlap" in capsys.readouterr().out


def test_two_runs_at_the_same_time_are_an_overlap_even_where_the_monitor_saw_nothing(tmp_path):
    results, bench = study(tmp_path, gap_s=-10.0)  # each run starts 10 s before the previous one ended
    verdict = by_check(results, bench)["no_overlap"]
    assert not verdict.passed and "ran 10 s at the same time" in verdict.detail
    assert by_check(*study(tmp_path / "touching", gap_s=-0.9))["no_overlap"].passed  # the timestamps' second


def test_copies_of_run_folders_elsewhere_are_not_runs(tmp_path):
    """MLflow keeps each run's files as artifacts under results/mlflow: they are no second run."""
    results, bench = study(tmp_path)
    copy_dir = results / "mlflow" / "artifacts" / "abc" / "artifacts"
    copy_dir.mkdir(parents=True)
    for name in (runfiles.SUMMARY, runfiles.GPU_MONITOR):
        (copy_dir / name).write_text((results / "runs" / "baseline" / "default" / name).read_text())
    verdict = by_check(results, bench)["no_overlap"]
    assert verdict.passed and "4 training runs" in verdict.detail


def test_a_run_whose_monitor_saw_no_gpu_shows_nothing_and_fails(tmp_path):
    results, bench = study(tmp_path)
    monitor = results / "smoke" / "train_w1" / runfiles.GPU_MONITOR
    write_run_folder(monitor.parent, grid.run_config(CONFIG, STRONG), T0 - 100.0, 5.0, 1.0)
    header = monitor.read_text().splitlines()[0]
    monitor.write_text(header + "\n")
    verdict = by_check(results, bench)["no_overlap"]
    assert not verdict.passed and "train_w1/gpu_monitor.csv has no samples" in verdict.detail


def test_a_monitor_without_process_counts_cannot_show_there_was_no_overlap(tmp_path):
    results, bench = study(tmp_path)
    monitor = results / "runs" / "baseline" / "default" / runfiles.GPU_MONITOR
    rows = list(csv.DictReader(monitor.open()))
    write_csv(
        monitor,
        [{k: v for k, v in row.items() if not k.startswith(("foreign", "processes"))} for row in rows],
    )
    verdict = by_check(results, bench)["no_overlap"]
    assert not verdict.passed and "has no 'foreign_processes' column" in verdict.detail


def test_a_contended_point_fails(tmp_path):
    results, bench = study(tmp_path)
    runs = results / "tables" / "runs.csv"
    rows = list(csv.DictReader(runs.open()))
    rows[1].update(contended=True, contention="GPU-0: 1 foreign process (pid 7; 3100 MB) in 4 of 20 samples")
    write_csv(runs, rows)
    verdict = by_check(results, bench)["no_contention"]
    assert not verdict.passed and verdict.detail == "contended: scaling/strong/w1_r0"
    write_csv(runs, [{k: v for k, v in row.items() if k != "contended"} for row in rows])
    assert "no 'contended' column" in by_check(results, bench)["no_contention"].detail


def test_an_ncu_table_without_convolutions_fails(tmp_path):
    results, bench = study(
        tmp_path, kernels=(LOADER, "void at::native::index_elementwise_kernel<128, 4>(int)")
    )
    verdict = by_check(results, bench)["ncu_convolutions"]
    assert not verdict.passed and verdict.detail.startswith("0 convolution kernels in 2 launches")
    status = results / "profile" / "w1" / "ncu_status.json"
    status.write_text(json.dumps({"ran": False, "reason": "ERR_NVGPUCTRPERM: ...", "kernels": 0}))
    assert "ncu did not run: ERR_NVGPUCTRPERM" in by_check(results, bench)["ncu_convolutions"].detail


@pytest.mark.parametrize(("strong", "passed"), [(40_600.0, True), (40_400.0, False), (49_600.0, False)])
def test_the_strong_point_must_be_within_10_percent_of_the_benchmark(tmp_path, strong, passed):
    results, bench = study(tmp_path, strong_rate=strong, bench_rate=45_000.0)
    assert by_check(results, bench)["strong_vs_benchmark"].passed is passed


def test_a_benchmark_at_other_settings_is_no_comparison(tmp_path):
    results, bench = study(tmp_path)
    write_csv(bench, [benchmark_row(44_000.0, per_gpu_batch=512, channels_last=False)])
    verdict = by_check(results, bench)["strong_vs_benchmark"]
    assert not verdict.passed
    assert "channels_last False (run: True)" in verdict.detail and "batch 512 (run: 256)" in verdict.detail
    write_csv(bench, [{**benchmark_row(44_000.0), "name": "project trainer fp32"}])
    assert "no row 'project trainer bf16'" in by_check(results, bench)["strong_vs_benchmark"].detail


def test_the_benchmark_options_give_the_strong_points_settings(tmp_path, capsys):
    results, _ = study(tmp_path)
    run_dir = results / "runs" / "scaling" / "strong" / "w1_r0"
    assert studycheck.main(["bench-args", "--run-dir", str(run_dir)]) == 0
    options = capsys.readouterr().out.split()
    args = parse_run_args(["--device", "cuda", "--config", "config/gpu-one.yaml", *options])
    run = grid.run_config(CONFIG, STRONG)
    assert (args.precisions, args.batch, args.width) == (run["precision"], run["per_gpu_batch"], run["width"])
    assert args.channels_last is run["channels_last"] and run["compile"] is CONFIG["model"]["compile"]
    flipped = studycheck.benchmark_args({**copy.deepcopy(run), "channels_last": False})
    assert "--no-channels-last" in flipped


# -- the energy counter against the power integral: a printed number, FAIL only when absurd --


def with_energy(results: Path, counter_w: float, power_w: float = 400.0) -> None:
    """The strong point's monitor with a known counter (counter_w) and power samples (power_w)."""
    samples = [
        {
            "time_s": 0.1 * i,
            "host": "gpu01",
            "gpu_index": 0,
            "gpu_uuid": "GPU-0",
            "processes": 1,
            "foreign_processes": 0,
            "power_w": power_w,
            "energy_j": counter_w * 0.1 * i,
        }
        for i in range(20)
    ]
    write_csv(results / studycheck.STRONG_W1 / runfiles.GPU_MONITOR, samples)


def check_output(results: Path, bench: Path, capsys) -> tuple[int, str]:
    code = studycheck.main(["check", "--results", str(results), "--benchmark", str(bench)])
    return code, capsys.readouterr().out


def test_the_counter_against_the_integral_is_printed_not_judged(tmp_path, capsys):
    results, bench = study(tmp_path)
    with_energy(results, counter_w=412.0)
    code, out = check_output(results, bench, capsys)
    assert code == 0 and "study check: all passed" in out
    line = next(line for line in out.splitlines() if "energy_counter_vs_integral" in line)
    assert line.startswith("INFO  ") and "over the whole run" in line
    assert "counter 782.8 J, power integral 760.0 J, counter / integral 1.0300" in line  # 1.9 s


def test_a_study_without_the_counter_says_why_and_still_passes(tmp_path, capsys):
    results, bench = study(tmp_path)  # the monitor files hold no energy or power columns
    code, out = check_output(results, bench, capsys)
    assert code == 0 and f"INFO  energy_counter_vs_integral: {studycheck.STRONG_W1}: not compared:" in out


def test_an_absurd_difference_between_counter_and_integral_fails(tmp_path, capsys):
    results, bench = study(tmp_path)
    with_energy(results, counter_w=4000.0)
    code, out = check_output(results, bench, capsys)
    assert code == 1 and "FAIL  energy_counter_vs_integral: counter / integral 10.0000" in out
    assert "FAILED: energy_counter_vs_integral" in out


# -- CUDA graphs: a run that expected them and ran without is a FAIL (issue 51) --


def with_graphs(results: Path, point: grid.Point, **graphs) -> None:
    """The run's summary.json with its cuda_graphs block (scalestudy.train.compiled's)."""
    path = results / Path(point.run_dir).relative_to("results") / runfiles.SUMMARY
    summary = json.loads(path.read_text())
    summary["results"]["cuda_graphs"] = {"expected": True, "skips": 0, "skip_reasons": None, **graphs}
    path.write_text(json.dumps(summary))


def test_a_run_whose_cuda_graphs_were_skipped_fails_and_says_why(tmp_path):
    results, bench = study(tmp_path)
    assert "no run expected CUDA graphs" in by_check(results, bench)["cuda_graphs"].detail
    with_graphs(results, STRONG, skipped=False, used=True)
    with_graphs(results, POINTS[2], skipped=False, used=True)
    verdict = by_check(results, bench)["cuda_graphs"]
    assert verdict.passed and verdict.detail == "all 2 runs that expected CUDA graphs ran them (no skip)"
    reason = "skipping cudagraphs due to mutated inputs (2 instances)"
    with_graphs(results, POINTS[2], skipped=True, used=False, skips=2, skip_reasons=reason)
    verdict = by_check(results, bench)["cuda_graphs"]
    assert not verdict.passed
    assert verdict.detail == f"1 of 2 runs without their CUDA graphs: runs/sensitivity/tf32/bs256: {reason}"


def test_the_project_against_the_reference_is_printed_with_its_target(tmp_path, capsys):
    results, bench = study(tmp_path, bench_rate=45_000.0)
    write_csv(bench, [benchmark_row(45_000.0), {**benchmark_row(18_000.0), "name": "reference trainer"}])
    line = studycheck.project_vs_reference(results, bench)
    assert line.startswith("INFO  project_vs_reference: 'project trainer bf16' 45,000 img/s vs")
    assert "2.50x (GPU target 3x: not met;" in line and "compile=True, compile_mode=auto" in line
    write_csv(bench, [benchmark_row(45_000.0)])
    assert "not compared" in studycheck.project_vs_reference(results, bench)
