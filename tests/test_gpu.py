"""What only a GPU can show, run where there is one and skipped elsewhere (saying so): the project
trainer on CUDA at every precision and compiled (with CUDA graphs, loading a compile job's
artifacts), with the NVML monitor sampling its GPU; the eager step captured whole; the
one-rank NCCL group; FSDP2 and DDP at one rank on NCCL (the GPT); the node description on a real
driver; Nsight Compute inside the trainer's NVTX step ranges. scripts/gpu_check.sh runs these with
the benchmarks on a GPU node; docs/measurements/ has what they showed."""

from __future__ import annotations

import csv
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from scalestudy.benchmark import pipelines, project
from scalestudy.benchmark.studyconfig import DEMO_CONFIG
from scalestudy.plan import cluster
from scalestudy.plan.studyconfig import load as load_config

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU: run `bash scripts/gpu_check.sh` on a GPU node"
)

BATCH = 64
STEPS = 10  # per epoch: the first epoch warms up, the second is the steady-state window
FP32_MATH = {"fp32": "ieee", "tf32": "tf32", "bf16": "ieee", "fp16": "ieee"}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return pipelines.write_packed(tmp_path_factory.mktemp("data"), BATCH * STEPS // 10, 10)


def gpu_run_config(data_dir: Path, **overrides) -> dict:
    return project.run_config(
        load_config(DEMO_CONFIG),
        data_dir,
        "unused",
        device="cuda",
        backend="nccl",
        per_gpu_batch=BATCH,
        width=64,
        epochs=2,
        max_steps_per_epoch=STEPS,
        measure_warmup_steps=STEPS,
        measure_steps=STEPS,
        measure_intervals=2,
        checkpoint_every_steps=10**9,
        num_workers=2,
        **overrides,
    )


def monitor_rows(run_dir: Path) -> list[dict]:
    with open(run_dir / "gpu_monitor.csv", newline="") as handle:
        return list(csv.DictReader(handle))


def numbers(rows: list[dict], column: str) -> list[float]:
    return [float(row[column]) for row in rows if row[column] != ""]


def test_the_one_rank_nccl_group_reduces_cuda_tensors_and_runs_the_stop_agreement():
    import torch.distributed as dist

    from scalestudy.train import parallel
    from scalestudy.train.state import StopRequest

    parallel.init_single_rank_group("nccl")
    try:
        tensor = torch.arange(4.0, device="cuda")
        dist.all_reduce(tensor)
        assert tensor.tolist() == [0.0, 1.0, 2.0, 3.0]
        stop = StopRequest()
        answers = [stop.agreed(None)]
        stop.signum = 15
        answers += [stop.agreed(None), stop.agreed(None)]
        assert answers == [False, False, True]
        gathered = [None]
        dist.all_gather_object(gathered, {"rank": 0})
        assert gathered == [{"rank": 0}]
    finally:
        dist.destroy_process_group()


def test_the_node_description_reads_this_gpu_and_its_driver_through_nvml():
    from scalestudy.preflight import nvidia, site_rules

    described = nvidia.gpus()
    assert described["available"], described
    assert len(described["devices"]) >= torch.cuda.device_count()  # NVML ignores CUDA_VISIBLE_DEVICES
    first = described["devices"][0]
    assert first["name"] and first["uuid"].startswith("GPU-") and first["memory_bytes"] > 0
    assert first["power_limit_w"] > 0
    driver = nvidia.host_driver_version()
    assert driver == described["driver"]
    assert site_rules.driver_is_new_enough(driver, torch.version.cuda)


@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16", "fp16"])
def test_the_trainer_trains_on_the_gpu_at_each_precision_and_the_monitor_samples_it(
    tmp_path, data_dir, precision
):
    trained = project.spawn_fresh(gpu_run_config(data_dir, precision=precision), tmp_path)
    results, provenance = trained.summary["results"], trained.summary["provenance"]
    assert results["device"] == "cuda" and results["backend"] == "nccl"
    assert results["precision_effective"] == precision
    assert results["window_filled"] and results["images_per_s"] > 0
    assert results["peak_memory_source"] == "cuda_max_memory_allocated"
    assert 0 < results["peak_memory_bytes"] < torch.cuda.get_device_properties(0).total_memory
    assert math.isfinite(results["final_train_loss"])
    math_used = FP32_MATH[precision]
    assert provenance["fp32_math"] == {
        "cudnn_conv": math_used,
        "cudnn_rnn": math_used,
        "cuda_matmul": math_used,
    }
    assert provenance["device_names"] == [torch.cuda.get_device_name(0)]
    run_dir = next(tmp_path.glob("run-*/out"))
    report = json.loads((run_dir / "gpu_monitor.json").read_text())
    assert report["available"], report
    rows = monitor_rows(run_dir)
    assert rows, "the monitor sampled nothing"
    assert max(numbers(rows, "kernel_active_pct")) > 0
    assert 0 < max(numbers(rows, "power_fraction")) <= 1.5
    assert max(numbers(rows, "mem_used_mb")) > 0
    peak_mib = results["peak_memory_bytes"] / 2**20
    print(f"\n{precision}: {results['images_per_s']:.0f} images/s, peak {peak_mib:.0f} MiB")


def test_the_gpt_trains_at_one_rank_under_ddp_and_fsdp2_on_nccl(tmp_path):
    out = tmp_path / "lm.csv"
    command = [sys.executable, "-m", "scalestudy.benchmark.lm", "--preset", "demo", "--device", "cuda"]
    command += ["--steps", "20", "--warmup", "5", "--repeats", "1", "--out", str(out)]
    subprocess.run(command + ["--runs-dir", str(tmp_path / "runs")], check=True, timeout=600)
    with open(out, newline="") as handle:
        rows = {row["name"]: row for row in csv.DictReader(handle)}
    assert len(rows) == 2, rows
    for row in rows.values():
        assert row["device"] == "cuda" and row["precision_effective"] == "bf16", row
        assert row["peak_memory_source"] == "cuda_max_memory_allocated", row
        assert float(row["tokens_per_s"]) > 0 and 0 < float(row["mfu_pct"]) < 100, row
        assert math.isfinite(float(row["final_train_loss"])), row


@pytest.mark.skipif(shutil.which("ncu") is None, reason="needs Nsight Compute (ncu) on the PATH")
def test_nsight_compute_profiles_the_kernels_inside_the_trainers_step_ranges(tmp_path, data_dir):
    config = load_config(DEMO_CONFIG)
    config["cluster"] = {**config["cluster"], "launcher": "local", "gpus_per_node": 1}
    config["train"] = {**config["train"], "device": "cuda"}  # the demo's cpu would launch CPU ranks
    spec = cluster.launch_spec(config, 1)
    run = gpu_run_config(data_dir, precision="bf16", profile={"tool": "nsys", "start_step": 12, "steps": 2})
    files = {name: tmp_path / f"ncu_{name}.csv" for name in ("kernels", "raw")}
    command = [sys.executable, "-m", "scalestudy.profiling.ncu", "run", "--launch-json", json.dumps(spec)]
    command += ["--run-config-json", json.dumps(run), "--work-dir", str(tmp_path / "work")]
    command += ["--launch-count", "20", "--status", str(tmp_path / "status.json")]
    command += [item for name, path in files.items() for item in (f"--{name}", str(path))]
    subprocess.run(command, check=True, cwd=tmp_path, timeout=600)
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["ran"] and status["reason"] is None, status
    assert status["window"] == "steps 12..13"
    with open(files["kernels"], newline="") as handle:
        kernels = list(csv.DictReader(handle))
    assert len(kernels) == status["kernels"] == 20
    assert all(row["name"] and float(row["duration_s"]) > 0 for row in kernels)
    assert all(0 <= float(row["compute_pct_of_peak"]) <= 100 for row in kernels)
    categories = {row["category"] for row in kernels}
    print(f"\nncu: {len(kernels)} launches, categories {sorted(categories)}")
    for row in kernels[:20]:
        print(f"  {row['category']:>10} {float(row['duration_s']) * 1e6:8.1f} us {row['name'][:90]}")
    # The loader's augmentation runs in the NVTX "data" range that ncu leaves out: the first launches
    # are the model's (before, all 20 were the loader's gather, fill and arange).
    assert "conv_gemm" in categories, categories


def test_the_trainer_compiles_the_model_on_the_gpu_without_graph_breaks(tmp_path, data_dir):
    """Compiled with CUDA graphs (compile_mode auto), once per shape: a compile job saves what it
    compiled, a second run loads it into its own cache and compiles nothing; both run their graphs."""
    artifacts = tmp_path / "key" / "artifacts.bin"
    job = gpu_run_config(data_dir, precision="bf16", compile=True, compile_cache_save=str(artifacts))
    job["inductor_cache_dir"] = str(tmp_path / "job-cache")
    project.spawn_fresh(job, tmp_path)
    point = gpu_run_config(data_dir, precision="bf16", compile=True, compile_cache_load=str(artifacts))
    point["inductor_cache_dir"] = str(tmp_path / "point-cache")
    trained = project.spawn_fresh(point, tmp_path)
    results = trained.summary["results"]
    assert results["window_filled"] and results["images_per_s"] > 0
    assert trained.summary["provenance"]["graph_breaks"] == 0
    graphs, compiled = results["cuda_graphs"], results["compile"]
    assert (graphs["expected"], graphs["used"], graphs["skips"]) == (True, True, 0), graphs
    assert compiled["mode"] == "reduce-overhead" and compiled["artifacts"]["loaded"] is True
    assert compiled["cache"]["fxgraph_hits"] >= 2 and compiled["cache"]["fxgraph_misses"] == 0, compiled
    rate, warm = results["images_per_s"], compiled["seconds"]
    print(f"\nbf16 compiled with CUDA graphs: {rate:.0f} images/s, warm compile {warm:.1f} s")


def test_the_eager_step_captured_whole_replays_the_eager_steps(tmp_path, data_dir):
    """scalestudy.benchmark.captured on the GPU: the graph is captured, its replays give the eager
    steps' weights (within bf16's rounding), and it is timed."""
    from scalestudy.benchmark import captured

    run = gpu_run_config(data_dir, precision="bf16")
    out = tmp_path / "captured.json"
    argv = ["--run-config-json", json.dumps(run), "--out", str(out), "--warmup", "5", "--steps", "20"]
    assert captured.main(argv) == 0
    result = json.loads(out.read_text())["results"]
    assert result["captured"] and result["check_error"] < captured.CHECK_TOLERANCE, result
    print(
        f"\nbf16 captured whole: {result['images_per_s']:.0f} images/s, capture {result['capture_s']:.2f} s"
    )
