"""scalestudy.benchmark: the arithmetic of its table, and that what it times does the real work.

No timing assertions: speed targets live in the benchmark's output (docs/guide/benchmarks.md).
"""

from __future__ import annotations

import csv
import itertools
import json
import math
import multiprocessing
import os
from types import SimpleNamespace

import pytest
import torch

from scalestudy.benchmark import (
    dag,
    matmul,
    measure,
    pipelines,
    project,
    reference_trainer,
    report,
    studyconfig,
    suite,
)
from scalestudy.benchmark.__main__ import main
from scalestudy.benchmark.reference_trainer import ReferenceTrainer
from scalestudy.benchmark.report import Row, Target
from scalestudy.benchmark.suite import Variant, project_variants, window_settings
from scalestudy.plan import studyconfig as plan_studyconfig


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """Synthetic CIFAR-10, 64 training images per class, as the trainer's packed arrays."""
    return pipelines.write_packed(tmp_path_factory.mktemp("packed"), 64, 4, seed=3)


@pytest.fixture
def one_thread():
    """Correctness tests train on one thread: on a busy machine two OpenMP threads can be 5x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# --- report arithmetic ---------------------------------------------------------------------------


def known_rows() -> list[Row]:
    return [
        Row("matmul", "mm", "TFLOP/s", (0.1, 0.3, 0.2)),
        Row("training", "ref", "img/s", (100.0, 90.0, 110.0), flops_per_item=1e9),
        Row("training", "fast", "img/s", (260.0, 240.0, 250.0), baseline="ref", flops_per_item=1e9),
    ]


def test_records_take_medians_ratios_and_mfu_against_the_peak():
    table = {r["name"]: r for r in report.records(known_rows(), peak_flops_per_s=1e12, context={"load": 0.5})}
    assert table["mm"]["median"] == pytest.approx(0.2)
    assert table["ref"]["ratio"] is None
    assert table["fast"]["ratio"] == pytest.approx(250 / 100)
    assert table["fast"]["vs"] == "ref"
    assert table["fast"]["mfu_pct"] == pytest.approx(100 * 250 * 1e9 / 1e12)  # 25 %
    assert table["mm"]["mfu_pct"] is None
    assert (table["fast"]["min"], table["fast"]["max"], table["fast"]["repeats"]) == (240, 260, 3)
    assert all(record["load"] == 0.5 for record in table.values())


def test_mfu_without_a_peak_is_left_empty_and_a_missing_baseline_is_an_error():
    assert all(r["mfu_pct"] is None for r in report.records(known_rows()))
    orphan = [Row("training", "fast", "img/s", (1.0,), baseline="nowhere")]
    with pytest.raises(ValueError, match="nowhere"):
        report.records(orphan)


def test_mfu_arithmetic():
    assert report.mfu(100.0, 3e9, 1e12) == pytest.approx(0.3)
    with pytest.raises(ValueError):
        report.mfu(100.0, 3e9, 0.0)


def test_targets_are_met_missed_or_not_measured():
    table = report.records(known_rows())
    checks = report.check_targets(
        [
            Target("ratio", "training", "fast", minimum=2.4),
            Target("ratio too low", "training", "fast", minimum=2.6),
            Target("value", "training", "fast", on="value", maximum=250),
            Target("absent", "training", "nothing", minimum=1),
        ],
        table,
    )
    assert [check.met for check in checks] == [True, False, True, None]
    text = report.format_checks(checks)
    assert "ratio too low: 2.5 (target >= 2.6): NOT MET" in text
    assert "absent: - (target >= 1): not measured" in text


def test_table_and_csv_hold_every_row(tmp_path):
    table = report.records(known_rows(), peak_flops_per_s=1e12)
    text = report.format_table(table)
    lines = text.splitlines()
    assert len(lines) == 2 + len(table) and lines[0].split()[:2] == ["section", "name"]
    assert "2.5" in lines[-1] and "25" in lines[-1]
    out = tmp_path / "sub" / "bench.csv"
    report.write_csv(out, table)
    rows = list(csv.DictReader(out.open()))
    assert [row["name"] for row in rows] == ["mm", "ref", "fast"]
    assert float(rows[2]["ratio"]) == pytest.approx(2.5)
    assert not list(out.parent.glob(".*tmp*")), "the atomic writer left a temporary file"


def test_format_number():
    assert report.format_number(None) == "-"
    assert report.format_number(12345.6) == "12,346"
    assert report.format_number(0.012345) == "0.0123"
    assert report.format_number(3) == "3"


# --- measurement primitives ------------------------------------------------------------------------


def test_interleave_alternates_runs_and_drops_the_warmup_rounds():
    calls = []
    counters = {name: itertools.count() for name in ("a", "b")}

    def run(name):
        def call():
            calls.append(name)
            return next(counters[name])

        return call

    kept = measure.interleave({"a": run("a"), "b": run("b")}, repeats=2, warmup=1)
    assert calls == ["a", "b"] * 3
    assert kept == {"a": [1, 2], "b": [1, 2]}
    with pytest.raises(ValueError):
        measure.interleave({"a": run("a")}, repeats=0)


def test_timed_rate_divides_the_work_by_the_wall_time(monkeypatch):
    clock = iter([10.0, 12.5])
    monkeypatch.setattr(measure.time, "perf_counter", lambda: next(clock))
    assert measure.timed_rate(lambda: 500) == pytest.approx(200.0)
    with pytest.raises(ValueError):
        measure.rate(1, 0.0)


def test_matmul_rate_counts_two_flops_per_multiply_add(monkeypatch):
    assert matmul.matmul_flops(3) == 54
    clock = iter([0.0, 2.0])
    monkeypatch.setattr(measure.time, "perf_counter", lambda: next(clock))
    assert matmul.matmul_rate("cpu", torch.float32, size=8, iterations=5) == pytest.approx(5 * 2 * 8**3 / 2.0)


# --- the compared pipelines ------------------------------------------------------------------------


def test_both_pipelines_deliver_the_same_normalised_batches(packed):
    batch = 32  # one epoch of the 640-image split each
    tensor = list(pipelines.tensor_loader(packed, batch, "cpu").epoch(0))
    classic = list(pipelines.tutorial_loader(packed, batch, "cpu", workers=0))
    assert len(tensor) == len(classic) == 20
    for (x1, y1), (x2, y2) in zip(tensor, classic, strict=True):
        assert x1.shape == x2.shape == (batch, 3, 32, 32) and x1.dtype == x2.dtype == torch.float32
        assert y1.shape == y2.shape == (batch,) and y1.dtype == y2.dtype == torch.int64
    images = [torch.cat([x for x, _ in epoch]) for epoch in (tensor, classic)]
    means = [x.mean(dim=(0, 2, 3)) for x in images]
    stds = [x.std(dim=(0, 2, 3)) for x in images]
    torch.testing.assert_close(means[0], means[1], atol=0.05, rtol=0)
    torch.testing.assert_close(stds[0], stds[1], atol=0.05, rtol=0)
    # Normalised with the CIFAR-10 statistics: this data's channels sit near mean 0 and std 1, and a
    # pipeline that skipped normalisation (0..1 or 0..255 values) would be far off both.
    assert all(m.abs().max() < 0.8 for m in means) and all(((s > 0.5) & (s < 1.6)).all() for s in stds)
    for epoch in (tensor, classic):  # each image once per epoch
        labels = torch.cat([y for _, y in epoch])
        assert torch.bincount(labels, minlength=10).tolist() == [64] * 10


def test_a_fresh_pass_skips_the_head_start_and_stops_its_workers(packed):
    before = set(multiprocessing.active_children())
    loader = pipelines.tutorial_loader(packed, 32, "cpu", workers=2)
    assert pipelines.prefetch_depth(loader) == 4

    def work(batches):
        assert len(set(multiprocessing.active_children()) - before) == 2  # the pass's workers run
        return sum(1 for _ in itertools.islice(batches, 10))

    assert pipelines.on_fresh_pass(loader, work) == 10
    assert set(multiprocessing.active_children()) == before, "the pass's workers still run"
    assert pipelines.on_fresh_pass(loader, lambda batches: sum(1 for _ in batches)) == 20 - 1 - 4
    assert pipelines.images_per_class(batches=10, batch=32, workers=2) == math.ceil((10 + 1 + 4) * 32 / 10)


def test_consume_counts_images_across_epoch_boundaries(packed):
    stream = pipelines.tensor_stream(pipelines.tensor_loader(packed, 100, "cpu"))  # 6 batches per epoch
    assert pipelines.consume(stream, 15, "cpu") == 1500


def test_tutorial_loader_uses_one_worker_per_core_by_default(packed):
    assert pipelines.tutorial_loader(packed, 8, "cpu").num_workers == pipelines.cpu_count()


# --- the reference trainer -------------------------------------------------------------------------


def test_reference_trainer_really_trains(packed, one_thread):
    torch.manual_seed(0)
    trainer = ReferenceTrainer(width=4, device="cpu", lr=0.05)
    fixed = next(pipelines.tensor_stream(pipelines.tensor_loader(packed, 32, "cpu")))
    images, losses = trainer.train(itertools.repeat(fixed), steps=10)
    assert images == 10 * 32
    assert losses[-1] < 0.7 * losses[0], losses
    assert trainer.model.fc.in_features == 8 * 4  # the CIFAR ResNet-18 at width 4
    assert not next(trainer.model.parameters()).is_contiguous(memory_format=torch.channels_last)


# --- the project trainer, as a job runs it ---------------------------------------------------------


@pytest.mark.parametrize("name", ["demo.yaml", "config.yaml", "demo-gpt.yaml"])
def test_a_study_config_is_read_as_snakemake_does_without_importing_it(name):
    """scalestudy.plan.studyconfig.load, the one reader outside Snakemake: a GPU node runs the
    benchmark without Snakemake (the first H100 run failed on its import)."""
    import subprocess
    import sys

    import yaml
    from snakemake.utils import validate

    from scalestudy.plan import schema

    path = studyconfig.REPO / "config" / name
    expected = yaml.safe_load(path.read_text())
    validate(expected, schema.PATH)
    assert plan_studyconfig.load(path) == expected
    probe = "import sys; from scalestudy.plan import studyconfig; "
    probe += f"studyconfig.load({str(path)!r}); "
    probe += "print(sorted(m for m in sys.modules if m.startswith('snakemake')))"
    result = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True)
    assert result.stdout.strip() == "[]"


def test_the_reference_row_says_how_its_fp32_ran_on_a_gpu():
    """torch's defaults run cuDNN convolutions in TF32: on an H100 that made the reference 2x the
    project's IEEE fp32 (docs/guide/benchmarks.md), so its row must not read as plain fp32 there."""
    from scalestudy.train import process

    math = reference_trainer.reference_math
    assert math(torch.device("cpu")) == "fp32"
    assert math(torch.device("cuda")) == "fp32, torch's defaults (cuDNN convolutions in tf32)"
    before = process.fp32_math()
    process.set_fp32_math("ieee")  # what the project trainer's fp32 sets
    try:
        assert math(torch.device("cuda")).endswith("(cuDNN convolutions in ieee)")
    finally:
        process.set_fp32_math(before["cudnn_conv"], before["cudnn_rnn"], before["cuda_matmul"])


def test_run_config_is_the_project_setting_with_the_benchmark_on_top(demo_config, tmp_path):
    run = project.run_config(demo_config, tmp_path / "d", tmp_path / "c", per_gpu_batch=48, width=4)
    assert (run["per_gpu_batch"], run["global_batch"], run["world_size"]) == (48, 48, 1)
    assert run["loader"] == "tensor" and run["width"] == 4
    assert run["channels_last"] == demo_config["model"]["channels_last"]
    assert run["data_dir"] == str(tmp_path / "d") and run["checkpoint_dir"] == str(tmp_path / "c")
    json.dumps(run)  # what the trainer's --run-config-json receives


def test_project_variants_add_channels_last_on_the_cpu_only_when_nobody_chose():
    assert project_variants(["fp32"], None, False, "cpu") == (
        Variant("project trainer fp32", (("precision", "fp32"),)),
        Variant("project trainer fp32 channels_last", (("precision", "fp32"), ("channels_last", True))),
    )
    assert project_variants(["fp32"], None, True, "cpu") == (
        Variant("project trainer fp32", (("precision", "fp32"),)),
    )
    forced = project_variants(["fp32", "bf16"], False, True, "cuda")
    assert [dict(v.overrides) for v in forced] == [
        {"precision": "fp32", "channels_last": False},
        {"precision": "bf16", "channels_last": False},
    ]
    assert len(project_variants(["bf16"], None, False, "cuda")) == 1


def test_marker_times_take_the_first_matching_line():
    lines = [
        ("2026-01-01T00:00:00 INFO scalestudy.train: model: ResNet-18", 1.0),
        ("2026-01-01T00:00:00 INFO scalestudy.train: training: 1 ranks", 1.5),
        ("2026-01-01T00:00:01 INFO scalestudy.train: epoch 1/1 step 1/3 | loss 2.3", 2.0),
        ("2026-01-01T00:00:01 INFO scalestudy.train: epoch 1/1 step 2/3 | loss 2.2", 3.0),
    ]
    seen = project.marker_times(lines)
    assert seen == {"model_built": 1.0, "loop_entered": 1.5, "first_step": 2.0}


def test_the_spawned_trainer_reaches_every_marker(demo_config, packed, tmp_path):
    """The markers match the real trainer's log lines (a changed log format fails here)."""
    run = project.run_config(
        demo_config,
        packed,
        "unused",
        per_gpu_batch=16,
        width=4,  # channels_last on the CPU: the workload trains it contiguous (resnet_cifar.workload)
        epochs=2,
        max_steps_per_epoch=2,
        log_every_steps=1,  # step 1 is logged (the first_step marker)
        device="cpu",
        **window_settings(SimpleNamespace(steps=2, epochs=2)),
    )
    result = project.spawn_fresh(run, tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert set(result.markers) == set(project.MARKERS)
    times = [result.markers[name] for name in project.MARKERS]
    assert times == sorted(times) and 0 < times[-1] < result.wall_s
    results = result.summary["results"]
    assert results["steps"] == 4 and results["window_filled"]  # epoch 2 is the window
    assert (results["warmup_steps"], results["measured_steps"], results["measure_start_step"]) == (2, 2, 2)
    assert result.images_per_s == results["images_per_s"] > 0


def test_a_trainer_run_without_a_filled_window_gives_no_rate():
    unfilled = {"window_filled": False, "measured_steps": 3, "measure_steps": 40, "warmup_steps": 20}
    with pytest.raises(RuntimeError, match="window was not filled"):
        _ = project.TrainerRun({"results": {**unfilled, "images_per_s": None}}).images_per_s


def test_a_trainer_run_that_shared_its_gpu_gives_no_rate():
    shared = {
        "window_filled": True,
        "images_per_s": 9864.0,
        "contended": True,
        "contention": "GPU-a: 8 foreign",
    }
    with pytest.raises(RuntimeError, match="GPU was shared while the trainer measured: GPU-a: 8 foreign"):
        _ = project.TrainerRun({"results": shared}).images_per_s
    assert project.TrainerRun({"results": {**shared, "contended": False}}).images_per_s == 9864.0


def test_import_probe_times_the_import_inside_the_whole_process():
    imported, process = suite.import_seconds()
    assert 0 < imported < process


# --- the dry-run benchmark -------------------------------------------------------------------------


def test_bench_grid_is_a_valid_config_with_at_least_1000_points():
    config = plan_studyconfig.load(studyconfig.REPO / "config" / "bench-grid.yaml")
    assert dag.count_points(config) >= 1000


def test_planned_jobs_reads_the_job_stats_total():
    output = "Job stats:\njob    count\n---  -----\nall      1\nfetch    1\ntotal    2\n\nThis was a dry-run"
    assert dag.planned_jobs(output) == 2
    assert dag.planned_jobs("Nothing to be done.") is None


def test_workflow_hotspots_keep_only_the_workflows_own_code(tmp_path):
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.runcall(dag.count_points, plan_studyconfig.load(studyconfig.DEMO_CONFIG))
    stats = pstats.Stats(profiler)
    hotspots = dag.workflow_hotspots(stats)
    assert hotspots and all("scalestudy/" in name for name, *_ in hotspots)
    assert any("grid.py" in name and "all_points" in name for name, *_ in hotspots)
    assert hotspots == sorted(hotspots, key=lambda row: row[3], reverse=True)


# --- the command -----------------------------------------------------------------------------------


def test_command_writes_the_csv_of_the_sections_it_ran(tmp_path, capsys):
    out = tmp_path / "bench.csv"
    assert main(["--device", "cpu", "--sections", "matmul", "--repeats", "1", "--out", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert [row["section"] for row in rows] == ["matmul"]
    assert float(rows[0]["median"]) > 0 and rows[0]["device"] == "cpu" and rows[0]["load_1m_start"]
    printed = capsys.readouterr().out
    assert "matmul float32 2048x2048" in printed and "not measured" in printed
    with pytest.raises(SystemExit):
        main(["--sections", "matmul,nonsense"])


# --- its run configs are the trainer's -------------------------------------------------------------


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_every_run_config_the_benchmark_spawns_passes_the_trainers_rules(device, tmp_path):
    """Built before any measurement, from the study config and checked against runconfig.RULES with
    the trainer's DEFAULTS: a fixed-cost run with measure_warmup_steps=0 once failed after 77 s."""
    from scalestudy.benchmark.__main__ import SECTIONS, choose_settings, default_config, parse_run_args
    from scalestudy.plan import runconfig

    config = plan_studyconfig.load(default_config(device))
    settings = choose_settings(parse_run_args(["--device", device]), config)
    runs = suite.run_configs(settings, config, tmp_path, SECTIONS)
    assert len(runs) == len(settings.variants) + 1
    for run in runs:
        runconfig.validate({**runconfig.DEFAULTS, **run})
        assert set(run) <= set(runconfig.DEFAULTS) | set(runconfig.REQUIRED)
    fixed = runs[-1]
    assert (fixed["epochs"], fixed["max_steps_per_epoch"]) == (1, 1)
    assert fixed["measure_warmup_steps"] == runconfig.RULES["measure_warmup_steps"].minimum == 1


def test_a_run_config_the_trainer_would_refuse_fails_at_once_naming_the_key(demo_config, tmp_path, capsys):
    from scalestudy.plan.runconfig import RunConfigError

    with pytest.raises(RunConfigError, match="measure_warmup_steps=0 must be an integer >= 1"):
        project.run_config(demo_config, tmp_path, tmp_path, measure_warmup_steps=0)
    with pytest.raises(RunConfigError, match="does not know: no_such_key"):
        project.run_config(demo_config, tmp_path, tmp_path, no_such_key=1)
    out = tmp_path / "bench.csv"
    argv = ["--device", "cpu", "--sections", "training,fixed_cost", "--steps", "0", "--out", str(out)]
    assert main(argv) == 2  # --steps 0 is the trainer's max_steps_per_epoch=0: refused, not replaced by 20
    assert "max_steps_per_epoch=0" in capsys.readouterr().err and not out.exists()


def test_job_counts_reads_the_first_job_stats_table_rule_by_rule():
    first = "Job stats:\njob          count\n---------  -------\nall              1\n"
    first += "scaling_run      4\ntotal            5\n"
    later = "Job stats:\njob    count\n---  -----\nall      1\ntotal    1\n"
    assert dag.job_counts(f"Building DAG of jobs...\n{first}\nrule all:\n{later}") == {
        "all": 1,
        "scaling_run": 4,
    }
    assert dag.job_counts("Nothing to be done (all requested files are present and up to date).") == {}
