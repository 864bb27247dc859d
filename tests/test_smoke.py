"""Smoke tests: their run configs, the loader and checkpoint measurements, a failing training step
stopping with the reason, the acceptance row, and their place in the demo's DAG (gates of training)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from scalestudy.analysis import acceptance
from scalestudy.plan import runconfig
from scalestudy.preflight import smoke
from tests.conftest import run_snakemake

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    folder = tmp_path_factory.mktemp("packed")
    rng = np.random.default_rng(0)
    for split, n in (("train", 96), ("test", 16)):
        np.save(folder / f"{split}_images.npy", rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8))
        np.save(folder / f"{split}_labels.npy", rng.integers(0, 10, n).astype(np.int64))
    return folder


def test_step_run_config_is_a_few_steps_of_the_real_point(demo_config):
    run = smoke.step_run_config(demo_config, 2)
    assert (run["stage"], run["point"], run["world_size"]) == ("smoke", "w2", 2)
    assert run["per_gpu_batch"] == 32 and run["global_batch"] == 64  # strong/w2 of the demo
    assert (run["epochs"], run["max_steps_per_epoch"], run["eval_max_batches"]) == (1, 2, 1)
    assert run["checkpoint_dir"] == "results/checkpoints/smoke/w2" and run["backend"] == "gloo"
    runconfig.validate({**runconfig.DEFAULTS, **run})  # the trainer takes it


def test_saves_per_epoch_at_the_most_frequent_checkpointing(demo_config):
    # demo: 1,600 synthetic images; the smallest global batch (sensitivity bs16 x 2 = 32) gives
    # 50 steps, capped at max_steps_per_epoch 25; a save every 20 steps -> 2 saves per epoch
    assert smoke.saves_per_epoch(demo_config) == {
        "train_images": 1600,
        "steps_per_epoch": 25,
        "checkpoint_every_steps": 20,
        "saves_per_epoch": 2,
    }
    assert smoke.saves_per_epoch(demo_config, train_images=50000)["saves_per_epoch"] == 2


def loader_run(packed, loader="tensor"):
    return {
        "device": "cpu",
        "per_gpu_batch": 16,
        "seed": 0,
        "channels_last": False,
        "loader": loader,
        "num_workers": 0,
        "data_dir": str(packed),
        "width": 4,
        "momentum": 0.9,
    }


@pytest.mark.parametrize("loader", ["tensor", "dataloader"])
def test_loader_throughput_counts_the_timed_batches(packed, loader):
    result = smoke.loader_throughput(loader_run(packed, loader), batches=8)  # 6 batches per epoch: wraps
    assert result["batches"] == 8 and result["loader"] == loader and result["device"] == "cpu"
    assert result["images_per_s"] == pytest.approx(8 * 16 / result["seconds"])
    assert result["first_batch_s"] > 0


def test_a_loader_below_its_target_fails_naming_the_key():
    result = {"loader": "dataloader", "images_per_s": 900.0, "device": "cuda:0"}
    smoke.check_loader(result, None)
    smoke.check_loader(result, 800.0)
    with pytest.raises(smoke.SmokeFailure, match=r"900 images/s .* smoke.loader_min_images_per_s=1000"):
        smoke.check_loader(result, 1000.0)


def test_checkpoint_bandwidth_of_the_real_model(packed, tmp_path):
    import torch

    from scalestudy.workloads.resnet_cifar import model

    directory = tmp_path / "ckpt"
    result = smoke.checkpoint_bandwidth(loader_run(packed), repeats=2, directory=str(directory))
    parameters = model.count_parameters(model.build_model(4))
    # weights and momentum buffers in fp32 (plus batch-norm buffers and pickling): at least 8 B each
    assert result["bytes"] > 8 * parameters
    assert result["write_mb_s"] == pytest.approx(result["bytes"] / result["write_s"] / 1e6)
    assert result["read_mb_s"] == pytest.approx(result["bytes"] / result["read_s"] / 1e6)
    assert not directory.exists()  # removed: the smoke test leaves no checkpoint behind
    assert torch.get_num_threads() == 1


def test_io_command_line_writes_its_json(packed, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "results/smoke/io.json"
    epoch = {"train_images": 96, "steps_per_epoch": 6, "checkpoint_every_steps": 4, "saves_per_epoch": 2}
    code = smoke.main(
        [
            "io",
            "--run-config-json", json.dumps(loader_run(packed)),
            "--settings-json", json.dumps({"loader_batches": 4, "loader_min_images_per_s": None,
                                           "checkpoint_repeats": 1}),
            "--epoch-json", json.dumps(epoch),
            "--out", str(out),
        ]
    )  # fmt: skip
    assert code == 0
    record = json.loads(out.read_text())
    saved = record["checkpoint"]
    assert saved["save_s_per_epoch"] == pytest.approx(2 * saved["write_s"]) and saved["saves_per_epoch"] == 2
    assert record["loader"]["batches"] == 4 and record["provenance"]["timestamp"]
    assert not (tmp_path / "results/checkpoints/smoke/io").exists()
    table = tmp_path / "smoke.csv"
    assert smoke.main(["table", "--inputs", str(out), "--out", str(table)]) == 0
    text = table.read_text()
    assert text.startswith("check,world_size,value,unit,detail\n") and "checkpoint write" in text


def test_a_loader_too_slow_for_its_target_stops_with_the_reason(packed, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "io.json"
    settings_ = {"loader_batches": 2, "loader_min_images_per_s": 1e12, "checkpoint_repeats": 1}
    code = smoke.main(
        ["io", "--run-config-json", json.dumps(loader_run(packed)), "--settings-json", json.dumps(settings_),
         "--epoch-json", "{}", "--out", str(out)]
    )  # fmt: skip
    assert code == smoke.EXIT_FAILED and not out.exists()
    assert "below smoke.loader_min_images_per_s=1e+12" in capsys.readouterr().err


def test_bad_input_exits_2_naming_it_and_writes_nothing(tmp_path, capsys):
    broken = tmp_path / "io.json"
    broken.write_text('{"check": "io", ')  # cut short
    table = tmp_path / "smoke.csv"
    assert smoke.main(["table", "--inputs", str(broken), "--out", str(table)]) == 2
    assert f"smoke: error: {broken}: not a JSON record" in capsys.readouterr().err and not table.exists()
    out = tmp_path / "step.json"
    argv = ["step", "--launch-json", "{}", "--run-config-json", "{world_size: 1", "--out-dir", str(tmp_path)]
    assert smoke.main([*argv, "--out", str(out)]) == 2 and not out.exists()
    assert "smoke: error: Expecting property name" in capsys.readouterr().err


def test_a_failing_training_step_fails_with_the_trainers_exit_code(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = {"world_size": 1, "per_gpu_batch": 8, "global_batch": 8, "epochs": 1, "device": "cpu"}
    run |= {"data_dir": str(tmp_path / "missing"), "checkpoint_dir": str(tmp_path / "ckpt")}
    with pytest.raises(smoke.SmokeFailure, match=r"world size 1 failed \(trainer exit 2\)"):
        smoke.run_step({"launcher": "local", "world_size": 1}, run, str(tmp_path / "out"))


def test_nccl_debug_is_info_on_gpus_whatever_the_config_says():
    spec = {"world_size": 2, "env": {"NCCL_DEBUG": "WARN", "OMP_NUM_THREADS": "8"}}
    assert smoke.with_nccl_debug(spec, {"device": "cpu"}) is spec
    on_gpu = smoke.with_nccl_debug(spec, {"device": "auto"})
    assert (
        on_gpu["env"] == {"NCCL_DEBUG": "INFO", "OMP_NUM_THREADS": "8"}
        and spec["env"]["NCCL_DEBUG"] == "WARN"
    )


def test_nccl_lines_keep_version_and_transport():
    lines = [
        "0: n1:123:123 [0] NCCL INFO Bootstrap : Using ib0:10.0.0.1<0>\n",
        "0: n1:123:123 [0] NCCL INFO NCCL version 2.27.3+cuda12.9\n",
        "0: n1:123:130 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:10.0.0.1<0>\n",
        "0: n1:123:130 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM\n",
        "epoch 1/1 step 1/3 | loss 2.30\n",
    ]
    assert smoke.nccl_lines(lines) == [line.strip() for line in lines[1:4]]


def test_step_record_as_table_rows():
    record = {"check": "step", "world_size": 2, "step_time_s": 0.125, "images_per_s": None}
    record |= {"backend": "nccl", "device_name": "NVIDIA H100", "hosts": ["n1", "n2"]}
    rows = smoke.table_rows(record)
    assert rows[0] == {
        "check": "training step",
        "world_size": 2,
        "value": "0.125",
        "unit": "s",
        "detail": "nccl on NVIDIA H100; hosts n1, n2",
    }
    assert rows[1]["value"] == "n/a"


def test_loader_acceptance_row_against_the_fastest_training_per_rank():
    import pandas as pd

    scaling = pd.DataFrame(
        {"mode": ["strong", "weak"], "world_size": [2, 2], "images_per_s_per_gpu_mean": [800.0, 1000.0]}
    )
    io_result = {"loader": {"loader": "tensor", "images_per_s": 1500.0, "device": "cpu"}}
    (row,) = acceptance.loader_rows(io_result, scaling)
    assert row["measured"] == pytest.approx(1.5) and row["status"] == acceptance.PASS
    assert "weak, N=2" in row["note"]
    io_result["loader"]["images_per_s"] = 500.0
    assert acceptance.loader_rows(io_result, scaling)[0]["status"] == acceptance.FAIL
    assert acceptance.loader_rows(None, scaling)[0]["status"] == acceptance.NOT_MEASURED


def test_the_checks_gate_every_training_job_in_the_demo_dag(workflow_copy):
    """A dry run of one training point plans the smoke tests first; `all` has system and comm too."""
    point = run_snakemake(workflow_copy, "-n", "results/runs/scaling/strong/w1_r0/summary.json")
    planned = set(re.findall(r"^(?:local)?rule (\w+):", point.stdout, re.M))
    assert {"smoke_io", "smoke_step", "scaling_run"} <= planned
    assert "wildcards: world=2" in point.stdout and "wildcards: world=1" in point.stdout  # both smoke steps
    everything = run_snakemake(workflow_copy, "-n")
    planned = set(re.findall(r"^(?:local)?rule (\w+):", everything.stdout, re.M))
    expected = {"system", "table_system", "smoke_io", "smoke_step", "table_smoke"}
    expected |= {"comm_bench", "table_comm_bench", "figure_comm_busbw", "table_comm_model"}
    assert expected <= planned, sorted(expected - planned)
