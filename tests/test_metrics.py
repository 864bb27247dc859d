"""Scaling metrics with known answers: efficiency, repeat statistics, MFU, time to target."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from scalestudy.analysis import metrics, modelsize, settings, stats
from scalestudy.analysis.constructed_study import run_row

SETTINGS = settings.resolved({})
T1 = 0.2  # seconds per step on one GPU


def strong_runs(efficiency: float = 0.8, worlds=(1, 2, 4, 8), global_batch: int = 1024) -> list[dict]:
    """Strong scaling where T(N) = T(1) / (efficiency N), except T(1) itself."""
    rows = []
    for n in worlds:
        step = T1 if n == 1 else T1 / (efficiency * n)
        rows.append(run_row("scaling", n, global_batch // n, step, mode="strong"))
    return rows


def weak_runs(efficiency: float = 0.8, worlds=(1, 2, 4, 8)) -> list[dict]:
    """Weak scaling where the step time at fixed per-GPU work grows to T(1) / efficiency."""
    return [run_row("scaling", n, 256, T1 if n == 1 else T1 / efficiency, mode="weak") for n in worlds]


def table(rows) -> pd.DataFrame:
    return metrics.scaling_table(metrics.run_metrics(pd.DataFrame(rows), SETTINGS), SETTINGS)


def test_strong_efficiency_is_known_answer():
    scaling = table(strong_runs(0.8)).set_index("world_size")
    assert scaling.loc[1, "efficiency_mean"] == pytest.approx(1.0)
    for n in (2, 4, 8):
        assert scaling.loc[n, "efficiency_mean"] == pytest.approx(0.8)
        assert scaling.loc[n, "speedup_mean"] == pytest.approx(0.8 * n)


def test_strong_efficiency_equals_epoch_time_definition():
    """E_s = T(1) / (N T(N)) with T the time per epoch of the same global work."""
    scaling = table(strong_runs(0.8)).set_index("world_size")
    epoch = scaling["epoch_time_s_mean"]
    for n in (2, 4, 8):
        assert epoch[1] / (n * epoch[n]) == pytest.approx(scaling.loc[n, "efficiency_mean"])


def test_weak_efficiency_is_step_time_ratio():
    scaling = table(weak_runs(0.8)).set_index("world_size")
    for n in (2, 4, 8):
        assert scaling.loc[n, "efficiency_mean"] == pytest.approx(0.8)
        step_ratio = scaling.loc[1, "time_per_step_s_mean"] / scaling.loc[n, "time_per_step_s_mean"]
        assert step_ratio == pytest.approx(0.8)


def test_modes_are_referenced_to_their_own_one_gpu_run():
    scaling = table(strong_runs(0.8) + weak_runs(0.5)).set_index(["mode", "world_size"])
    assert scaling.loc[("strong", 8), "efficiency_mean"] == pytest.approx(0.8)
    assert scaling.loc[("weak", 8), "efficiency_mean"] == pytest.approx(0.5)


def test_no_one_gpu_run_leaves_efficiency_empty():
    scaling = table(strong_runs(0.8, worlds=(2, 4)))
    assert scaling["efficiency_mean"].isna().all()


def test_repeat_statistics_and_interval():
    steps = [256 / 100, 256 / 110, 256 / 120]  # per-GPU throughput 100, 110, 120 images/s
    rows = [run_row("scaling", 1, 256, s, mode="weak", repeat=r) for r, s in enumerate(steps)]
    row = table(rows).iloc[0]
    half = 4.302652729911275 * 10.0 / math.sqrt(3)  # t(0.975, df=2) * std / sqrt(n)
    assert row["repeats"] == 3
    assert row["images_per_s_per_gpu_mean"] == pytest.approx(110.0)
    assert row["images_per_s_per_gpu_std"] == pytest.approx(10.0)
    assert row["images_per_s_per_gpu_ci_low"] == pytest.approx(110.0 - half)
    assert row["images_per_s_per_gpu_ci_high"] == pytest.approx(110.0 + half)


def test_single_repeat_has_nan_interval_not_zero():
    row = table([run_row("scaling", 1, 256, 0.1, mode="weak")]).iloc[0]
    assert row["repeats"] == 1
    assert math.isnan(row["images_per_s_std"])
    assert math.isnan(row["images_per_s_ci_low"]) and math.isnan(row["images_per_s_ci_high"])


@pytest.mark.parametrize(
    ("df", "expected"), [(1, 12.7062047), (2, 4.3026527), (4, 2.7764451), (30, 2.0422725)]
)
def test_t_quantile_matches_tables(df, expected):
    assert stats.t_quantile(0.975, df) == pytest.approx(expected, rel=1e-6)
    assert stats.t_quantile(0.025, df) == pytest.approx(-expected, rel=1e-6)


def test_repeat_stats_ignores_missing_values():
    result = stats.repeat_stats([1.0, None, float("nan"), 3.0])
    assert result["n"] == 2 and result["mean"] == pytest.approx(2.0)


def test_mfu_arithmetic():
    flops_per_image = 3 * (270336 * 64**2 + 55456 * 64)  # training = 3 x forward
    expected = 1000.0 * flops_per_image / 989.4e12
    forward = metrics.closed_form(pd.Series({"workload": "resnet18-cifar10", "config.width": 64}))[1]
    got = metrics.mfu_of_flops(1000.0, 3 * forward, "bf16", "NVIDIA H100 80GB HBM3", "cuda", SETTINGS)
    assert got == pytest.approx(expected)
    assert got == pytest.approx(0.003368, rel=1e-3)


@pytest.mark.parametrize(
    ("device_name", "device", "precision", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", "cuda", "bf16", 989.4),
        ("NVIDIA H100 PCIe", "cuda", "bf16", 756.0),  # the longer key wins
        ("NVIDIA H100 NVL", "cuda", "bf16", 835.5),  # not the SXM's 989.4 (issue 24)
        ("NVIDIA H200 NVL", "cuda", "bf16", 835.5),
        ("NVIDIA H100 80GB HBM3", "cuda", "tf32", 494.7),  # precision tf32: its own peak
        ("NVIDIA A100-SXM4-80GB", "cuda", "fp32", 19.5),
        ("x86_64", "cpu", "fp32", 0.1),  # CPU runs match on the device
    ],
)
def test_peak_lookup(device_name, device, precision, peak):
    assert metrics.find_peak_tflops(SETTINGS["peak_tflops"], device_name, device, precision)[0] == peak


def test_unknown_device_gives_nan_mfu():
    assert math.isnan(metrics.mfu_of_flops(1000.0, 3.3e9, "bf16", "Some TPU", "xla", SETTINGS))


def test_model_size_matches_measured_constants():
    assert modelsize.parameters(64) == modelsize.PARAMS_W64
    assert modelsize.forward_flops_per_image(64) / 1e9 == pytest.approx(
        modelsize.FORWARD_GFLOP_W64_MEASURED, rel=1e-3
    )
    assert modelsize.gradient_bytes(64) / 1e6 == pytest.approx(44.7, abs=0.05)
    assert modelsize.bucket_count(modelsize.gradient_bytes(64), 25) == 2
    assert modelsize.gradient_bytes(64, "bf16") == modelsize.gradient_bytes(64) / 2


def test_time_to_target_counts_runs_that_reached_it():
    rows = [
        run_row("scaling", 1, 256, 0.1, mode="weak", repeat=0, time_to_target_s=100.0),
        run_row("scaling", 1, 256, 0.1, mode="weak", repeat=1, time_to_target_s=float("nan")),
        run_row("scaling", 1, 256, 0.1, mode="weak", repeat=2, time_to_target_s=200.0),
    ]
    row = table(rows).iloc[0]
    assert row["target_reached"] == 2
    assert row["time_to_target_s_mean"] == pytest.approx(150.0)


def test_sensitivity_gain_over_baseline():
    rows = [
        run_row("baseline", 1, 128, 128 / 1000.0),
        run_row(
            "sensitivity", 8, 128, 128 / 1300.0, **{"config.precision": "bf16", "config.bucket_cap_mb": 25}
        ),
        run_row("sensitivity", 8, 64, 64 / 900.0, **{"config.precision": "fp32", "config.bucket_cap_mb": 1}),
    ]
    sweep = metrics.sensitivity_table(metrics.run_metrics(pd.DataFrame(rows), SETTINGS)).set_index(
        "precision"
    )
    assert sweep.loc["bf16", "gain_vs_baseline"] == pytest.approx(0.3)
    assert sweep.loc["fp32", "gain_vs_baseline"] == pytest.approx(-0.1)
    assert bool(sweep.loc["bf16", "best"]) and not bool(sweep.loc["fp32", "best"])


def test_missing_column_names_the_table_and_column():
    runs = pd.DataFrame([run_row("scaling", 1, 256, 0.1, mode="weak")]).drop(columns=["images_per_s"])
    with pytest.raises(ValueError, match=r"runs\.csv: missing column\(s\) images_per_s"):
        metrics.run_metrics(runs, SETTINGS, "runs.csv")


def test_settings_defaults_and_validation():
    assert SETTINGS["acceptance"]["strong_efficiency_min"] == 0.7
    with pytest.raises(ValueError, match=r"analysis\.acceptance\.strong_efficiency_min"):
        settings.resolved({"acceptance": {"strong_efficiency_min": 1.5}})
    with pytest.raises(ValueError, match="analysis"):
        settings.resolved({"no_such_key": 1})


def test_gpus_per_node_follows_the_cluster_unless_set():
    assert (
        settings.with_defaults({})["comm_model"]["gpus_per_node"] is None
    )  # the schema says "the cluster's"
    assert settings.resolved({}, ranks_per_node=4)["comm_model"]["gpus_per_node"] == 4
    assert settings.resolved({})["comm_model"]["gpus_per_node"] == settings.DEFAULT_GPUS_PER_NODE
    assert (
        settings.resolved({"comm_model": {"gpus_per_node": 2}}, ranks_per_node=4)["comm_model"][
            "gpus_per_node"
        ]
        == 2
    )
    demo = settings.load(config_path=Path(__file__).resolve().parents[1] / "config/demo.yaml")
    assert demo["comm_model"]["gpus_per_node"] == 2  # demo.yaml: cluster.ranks_per_node 2


def test_metrics_cli_writes_both_tables(tmp_path):
    runs = pd.DataFrame(strong_runs(0.8) + [run_row("baseline", 1, 128, 0.1)])
    runs.to_csv(tmp_path / "runs.csv", index=False)
    metrics.main(
        [
            "--runs",
            str(tmp_path / "runs.csv"),
            "--scaling-out",
            str(tmp_path / "scaling.csv"),
            "--sensitivity-out",
            str(tmp_path / "sensitivity.csv"),
            "--analysis-json",
            "{}",
        ]
    )
    scaling = pd.read_csv(tmp_path / "scaling.csv")
    assert list(scaling["world_size"]) == [1, 2, 4, 8]
    assert pd.read_csv(tmp_path / "sensitivity.csv").empty


def test_mfu_uses_the_precision_the_run_actually_trained_in():
    settings_ = settings.resolved({"peak_tflops": {"gpu": {"fp32": 10.0, "fp16": 100.0, "bf16": 100.0}}})
    rows = [
        run_row("sensitivity", 1, 64, 0.064, device_name="gpu", **{"config.precision": "fp16"}),
        run_row(
            "sensitivity",
            1,
            64,
            0.064,
            device_name="gpu",
            precision_effective="fp32",
            **{"config.precision": "fp16"},
        ),
    ]
    runs = metrics.run_metrics(pd.DataFrame(rows), settings_)
    assert list(runs["precision"]) == ["fp16", "fp32"]
    assert runs["mfu"].iloc[1] == pytest.approx(10 * runs["mfu"].iloc[0])


def _unfilled(row: dict) -> dict:
    """The row of a run whose measurement window was not filled: no window rates, whole-run ones."""
    per_gpu = row["images_per_s_per_gpu"]
    return {
        **row,
        "window_filled": False,
        "images_per_s": None,
        "images_per_s_per_gpu": None,
        "whole_run_images_per_s": 0.5 * per_gpu * row["world_size"],
        "whole_run_images_per_s_per_gpu": 0.5 * per_gpu,
    }


def test_an_unfilled_window_is_marked_and_falls_back_to_the_whole_run_rate(tmp_path):
    rows = [{**r, "window_filled": True} for r in strong_runs(0.8, worlds=(1, 2))]
    rows.append(_unfilled(run_row("scaling", 2, 512, T1 / (0.8 * 2), mode="strong", repeat=1)))
    rows.append(_unfilled(run_row("baseline", 1, 128, 0.1)))
    rows.append(run_row("sensitivity", 8, 128, 0.1, window_filled=True))
    faster = run_row("sensitivity", 8, 64, 0.01, **{"config.bucket_cap_mb": 1})  # 3,200/s whole run
    rows.append(_unfilled(faster))
    pd.DataFrame(rows).to_csv(tmp_path / "runs.csv", index=False)  # as the catalog stores them
    out = {name: str(tmp_path / f"{name}.csv") for name in ("scaling", "sensitivity")}
    argv = ["--runs", str(tmp_path / "runs.csv"), "--analysis-json", "{}"]
    metrics.main([*argv, "--scaling-out", out["scaling"], "--sensitivity-out", out["sensitivity"]])
    scaling = pd.read_csv(out["scaling"]).set_index("world_size")
    assert scaling.loc[1, "window_filled"] and scaling.loc[1, "windows_unfilled"] == 0
    assert not scaling.loc[2, "window_filled"] and scaling.loc[2, "windows_unfilled"] == 1
    assert "1 of 2 repeat(s): window not filled" in scaling.loc[2, "note"]
    # repeat 0 at 0.8 efficiency, repeat 1 at half its throughput (whole run): the mean of both
    assert scaling.loc[2, "efficiency_mean"] == pytest.approx((0.8 + 0.4) / 2)
    sweep = pd.read_csv(out["sensitivity"]).set_index("per_gpu_batch")
    assert sweep.loc[128, "window_filled"] and not sweep.loc[128, "baseline_window_filled"]
    assert not sweep.loc[64, "window_filled"] and sweep.loc[64, "note"].startswith("window not filled")
    assert sweep.loc[128, "best"] and not sweep.loc[64, "best"]  # faster, but not from a window
    runs = metrics.run_metrics(pd.read_csv(tmp_path / "runs.csv"), SETTINGS)
    marked = runs[~runs["window_filled"]]
    assert set(marked["throughput_source"]) == {"whole run"} and len(marked) == 3
    assert (runs.loc[runs["window_filled"], "throughput_source"] == "window").all()


def test_rows_without_a_window_record_count_as_filled():
    runs = metrics.run_metrics(pd.DataFrame(strong_runs(0.8)), SETTINGS)
    assert runs["window_filled"].all() and (runs["note"] == "").all()


def test_acceptance_gives_no_verdict_from_an_unfilled_window():
    from scalestudy.analysis import acceptance

    criteria = SETTINGS["acceptance"]
    rows = strong_runs(0.8) + weak_runs(0.95)
    scaling = table(rows)
    baseline = run_row("baseline", 1, 128, 0.1)
    sweep = [run_row("sensitivity", 8, 128, 0.05, **{"config.bucket_cap_mb": 25})]
    sensitivity = metrics.sensitivity_table(metrics.run_metrics(pd.DataFrame([baseline, *sweep]), SETTINGS))
    verdicts = acceptance.evaluate(scaling, sensitivity, criteria)["status"].tolist()
    assert verdicts == ["pass", "pass", "pass"]
    strong_8 = next(i for i, r in enumerate(rows) if r["config.mode"] == "strong" and r["world_size"] == 8)
    weak_1 = next(i for i, r in enumerate(rows) if r["config.mode"] == "weak" and r["world_size"] == 1)
    for i in (strong_8, weak_1):
        rows[i] = _unfilled(rows[i])
    sensitivity = metrics.sensitivity_table(
        metrics.run_metrics(pd.DataFrame([_unfilled(baseline), *sweep]), SETTINGS)
    )
    judged = acceptance.evaluate(table(rows), sensitivity, criteria)
    assert (judged["status"] == "not measured (window not filled)").all(), judged.to_string()
    assert "not filled at N=8" in judged["note"].iloc[0] and "not filled at N=1" in judged["note"].iloc[1]
    assert "in the baseline" in judged["note"].iloc[2]
