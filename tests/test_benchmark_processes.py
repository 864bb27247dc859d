"""The benchmark's processes (issue 41): every trainer sample, the reference's too, runs in a fresh
process of its own, and the benchmark's own process starts no CUDA while they measure (a trainer's
GPU monitor would list it on the GPU as a foreign process); the sections that measure in its
process run after the trainers, the table in the sections' order."""

from __future__ import annotations

import csv
import os

import pytest
import torch

from scalestudy.benchmark import pipelines, project, reference_trainer, studyconfig, suite
from scalestudy.benchmark.__main__ import main
from scalestudy.benchmark.report import Row
from scalestudy.plan import studyconfig as plan_studyconfig


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """Synthetic CIFAR-10, 16 training images per class, as the trainer's packed arrays."""
    return pipelines.write_packed(tmp_path_factory.mktemp("packed"), 16, 2, seed=3)


def test_a_reference_sample_runs_in_a_fresh_process_of_its_own(packed):
    """The benchmark's own process holds no CUDA context while a trainer measures (issue 41: on an
    H100 its in-process reference made every project trainer's GPU monitor see a foreign process)."""
    job = reference_trainer.Job(str(packed), width=4, batch=16, steps=2, workers=0, device="cpu")
    assert reference_trainer.parse_args(job.argv()) == job
    run = reference_trainer.spawn(job)
    assert run.pid != os.getpid() and run.images_per_s > 0 and run.math == "fp32"
    assert not torch.cuda.is_initialized()
    with pytest.raises(RuntimeError, match="reference_trainer exited with 1"):
        reference_trainer.spawn(job, python="false")  # a process that fails: an error, not a sample
    with pytest.raises(SystemExit):
        reference_trainer.parse_args([*job.argv(), "--device=tpu"])


def test_the_trainers_run_before_anything_measures_in_this_process(monkeypatch, tmp_path):
    """Training and fixed cost (spawned processes) first, then matmul and pipeline (CUDA in this
    process); the table keeps the sections' order."""
    from scalestudy.benchmark.__main__ import SECTIONS, choose_settings, parse_run_args, run_sections

    called = []

    def section(name):
        def rows(*args):
            called.append(name)
            return [Row(name, name, "x", (1.0,))]

        return rows

    for name in SECTIONS:
        monkeypatch.setattr(suite, f"{name}_rows", section(name))
    config = plan_studyconfig.load(studyconfig.DEMO_CONFIG)
    settings = choose_settings(parse_run_args(["--device", "cpu", "--steps", "1", "--batch", "8"]), config)
    rows = run_sections(settings, list(SECTIONS), config)
    assert called == ["training", "fixed_cost", "matmul", "pipeline"]
    assert [row.section for row in rows] == list(SECTIONS)


def test_on_a_gpu_the_training_section_starts_no_cuda_in_the_benchmarks_process(monkeypatch):
    """--device cuda with both trainers stood in: any CUDA use here (a model or batch moved to the
    GPU, a synchronisation) would start CUDA in this process, which the trainers' monitors list."""
    from scalestudy.benchmark.__main__ import choose_settings, default_config, parse_run_args, run_sections

    def no_cuda_here():
        raise AssertionError("CUDA started in the benchmark's own process")

    spawned = []

    def reference(job):
        spawned.append(job)
        return reference_trainer.ReferenceRun(100.0, os.getpid() + 1, "fp32, torch's defaults (tf32)")

    def trainer(run, workdir):
        spawned.append(run)
        return project.TrainerRun({"results": {"images_per_s": 400.0, "contended": False}})

    monkeypatch.setattr(torch.cuda, "_lazy_init", no_cuda_here)
    monkeypatch.setattr(reference_trainer, "spawn", reference)
    monkeypatch.setattr(project, "spawn_fresh", trainer)
    config = plan_studyconfig.load(default_config("cuda"))
    argv = ["--device", "cuda", "--repeats", "2", "--steps", "1", "--batch", "8", "--precisions", "bf16"]
    rows = run_sections(choose_settings(parse_run_args(argv), config), ["training"], config)
    assert [(row.name, row.samples) for row in rows] == [
        (suite.REFERENCE, (100.0, 100.0)),
        ("project trainer bf16", (400.0, 400.0)),
    ]
    assert rows[0].settings.startswith("fp32, torch's defaults (tf32), DataLoader + PIL")
    assert [item.device for item in spawned[::2]] == ["cuda", "cuda"]  # the reference's jobs
    assert [item["device"] for item in spawned[1::2]] == ["cuda", "cuda"]  # the trainer's runs


def test_the_gpus_name_comes_from_a_fresh_process():
    from scalestudy.benchmark.__main__ import cpu_model, device_name

    assert device_name(torch.device("cpu")) == cpu_model()
    with pytest.raises(SystemExit, match="no CUDA device"):
        device_name(torch.device("cuda"), python="false")  # a probe that fails: one line, no traceback
    assert not torch.cuda.is_initialized()


def test_the_training_section_compares_two_fresh_processes(tmp_path, capsys):
    """`--sections training` at the smallest settings: a reference and a project row, the ratio, and
    no CUDA started in this process (the reference ran in its own)."""
    out = tmp_path / "bench.csv"
    argv = ["--device", "cpu", "--sections", "training", "--repeats", "1", "--steps", "1", "--batch", "8"]
    assert main([*argv, "--width", "4", "--precisions", "fp32", "--no-channels-last", "--out", str(out)]) == 0
    rows = {row["name"]: row for row in csv.DictReader(out.open())}
    assert set(rows) == {suite.REFERENCE, "project trainer fp32"}
    reference, trainer = rows[suite.REFERENCE], rows["project trainer fp32"]
    assert float(reference["median"]) > 0 and float(trainer["median"]) > 0
    assert trainer["vs"] == suite.REFERENCE
    assert float(trainer["ratio"]) == pytest.approx(float(trainer["median"]) / float(reference["median"]))
    assert (
        reference["settings"].startswith("fp32, DataLoader + PIL")
        and "fresh process" in reference["settings"]
    )
    assert not torch.cuda.is_initialized()
