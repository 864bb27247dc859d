"""Compile once per shape (issue 51), as planned: the compile keys of a study's runs, its compile
jobs (one per key of several runs; none without compile, so the demo's jobs and run configs do not
change), their run configs, and the workflow's rule (a dry run of the one-GPU study)."""

from __future__ import annotations

import json
import shlex

import pytest

from scalestudy.benchmark import dag
from scalestudy.plan import compilejobs, compilekeys, grid
from scalestudy.plan.studyconfig import load as study_config
from scalestudy.preflight import smoke
from tests.conftest import REPO, run_snakemake


@pytest.fixture(scope="module")
def gpu_one():
    return study_config(REPO / "config" / "gpu-one.yaml")


def _run(config, stage, name):
    return grid.run_config(config, grid.point_by_name(config, stage, name))


def test_a_key_is_what_the_compiled_graphs_depend_on_not_the_points_seed_or_length(gpu_one):
    strong, sweep = _run(gpu_one, "scaling", "strong/w1_r0"), _run(gpu_one, "sensitivity", "bf16/bs256")
    assert strong["seed"] == sweep["seed"] and strong["epochs"] != sweep["epochs"]
    assert compilekeys.key_of(strong) == compilekeys.key_of(sweep)
    assert compilekeys.key_of({**strong, "seed": 7, "repeat": 1, "mode": "weak"}) == compilekeys.key_of(
        strong
    )
    key = compilekeys.key_of(strong)
    assert key["wrapper"] == "bare" and key["width"] == 64 and key["channels_last"] is True
    for change in (
        {"per_gpu_batch": 512},
        {"precision": "tf32"},
        {"compile_mode": "default"},
        {"micro_batch": 64},
    ):
        assert compilekeys.key_of({**strong, **change}) != key, change
    ddp = {**strong, "world_size": 2, "global_batch": 512}
    assert compilekeys.key_of(ddp)["wrapper"] == "ddp-bucket25"
    assert compilekeys.key_of({**ddp, "world_size": 8}) == compilekeys.key_of(ddp)  # any DDP world size
    assert compilekeys.key_of({**ddp, "bucket_cap_mb": 1.0}) != compilekeys.key_of(ddp)
    assert compilekeys.key_of({**strong, "compile": False}) is None


def test_the_one_gpu_study_has_one_compile_job_for_its_key_of_three_runs(gpu_one):
    jobs = compilejobs.jobs(gpu_one)
    assert list(jobs) == [compilekeys.key_name(compilekeys.key_of(_run(gpu_one, "scaling", "strong/w1_r0")))]
    job = next(iter(jobs.values()))
    assert (job.world_size, job.points) == (1, 3) and job.name.startswith("bs256_bf16_auto_bare_")
    run = compilejobs.run_config(gpu_one, job)
    assert run["compile_cache_save"] == f"results/compile/{job.name}/artifacts.bin"
    assert "compile_cache_load" not in run and run["inductor_cache_dir"].endswith(f"compile/{job.name}")
    assert (run["stage"], run["epochs"], run["max_steps_per_epoch"]) == ("compile", 1, compilejobs.STEPS)
    for name in ("strong/w1_r0",):
        loaded = _run(gpu_one, "scaling", name)
        assert loaded["compile_cache_load"] == run["compile_cache_save"]
        assert loaded["inductor_cache_dir"] == "results/inductor-cache/scaling/strong/w1_r0"  # its own
    baseline = grid.run_config(gpu_one, grid.baseline_point(gpu_one))
    assert baseline["compile"] is False and "compile_cache_load" not in baseline  # the plain run
    assert smoke.step_run_config(gpu_one, 1)["compile"] is False  # the smoke step stays eager
    lone = _run(gpu_one, "sensitivity", "tf32/bs512")  # a key of one run: it compiles in its warm-up
    assert (
        compilejobs.artifacts_of(gpu_one, grid.point_by_name(gpu_one, "sensitivity", "tf32/bs512"), jobs)
        == []
    )
    assert lone["compile_cache_load"].endswith("/artifacts.bin")


def test_a_ddp_key_compiles_at_its_smallest_world_size():
    config = study_config(REPO / "config" / "config.yaml")
    jobs = compilejobs.jobs(config)
    ddp = [job for job in jobs.values() if "ddp-bucket" in job.name]
    assert ddp and all(job.world_size >= 2 and job.points >= compilejobs.MIN_RUNS for job in ddp)
    smallest = min(job.world_size for job in ddp)
    assert smallest == min(w for w in config["scaling"]["world_sizes"] if w > 1)
    run = compilejobs.run_config(config, ddp[0])
    assert (
        run["world_size"] == ddp[0].world_size
        and run["global_batch"] == run["per_gpu_batch"] * run["world_size"]
    )


def test_a_study_without_compile_plans_no_compile_job():
    for name in ("demo.yaml", "demo-gpt.yaml", "bench-grid.yaml"):
        config = study_config(REPO / "config" / name)
        assert compilejobs.jobs(config) == {}
        for point in grid.all_points(config):
            run = grid.run_config(config, point)
            assert not {"compile_cache_load", "inductor_cache_dir"} & set(run), (name, point)


def test_the_one_gpu_plan_runs_the_compile_job_before_the_runs_of_its_key(workflow_copy, gpu_one):
    result = run_snakemake(
        workflow_copy, "--dry-run", "--printshellcmds", "--configfile", "config/gpu-one.yaml"
    )
    jobs = dag.job_counts(result.stdout)
    assert jobs["compile_cache"] == 1 and jobs["sensitivity_run"] == 4
    name = next(iter(compilejobs.jobs(gpu_one)))
    artifacts = f"results/compile/{name}/artifacts.bin"
    blocks = result.stdout.split("\nrule ")
    waiting = [
        block.split(":", 1)[0]
        for block in blocks
        if "input:" in block and artifacts in block.split("output:")[0]
    ]
    assert sorted(waiting) == ["profile_ncu", "profile_run", "scaling_run", "sensitivity_run"], waiting
    command = next(
        line for line in result.stdout.splitlines() if f"--log results/logs/compile/{name}.log" in line
    )
    run = json.loads(shlex.split(command)[shlex.split(command).index("--run-config-json") + 1])
    assert run["compile_cache_save"] == artifacts and run["stage"] == "compile"
