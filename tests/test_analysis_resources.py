"""Resource estimate arithmetic: GPU-hours and node-hours of the grid and of a full training."""

from __future__ import annotations

import pandas as pd
import pytest

from scalestudy.analysis import commmodel, commpredict, metrics, resources, settings
from scalestudy.analysis.constructed_study import run_row


def analysis(**res):
    return settings.resolved({"resources": res, "comm_model": {"gpus_per_node": 2}})


def test_grid_hours_from_trainer_time_and_sacct():
    runs = pd.DataFrame(
        [
            run_row("scaling", 4, 64, 0.1, mode="strong", total_time_s=3600.0),
            run_row(
                "scaling", 1, 256, 0.1, mode="strong", total_time_s=1800.0, **{"sacct.elapsed_s": 7200.0}
            ),
        ]
    )
    rows = pd.DataFrame(resources.grid_rows(runs, gpus_per_node=2, overhead=1.5)).set_index("what")
    total = rows.loc["whole grid"]
    assert total["wall_hours"] == pytest.approx(1.0 + 2.0)  # sacct elapsed wins where present
    assert total["gpu_hours"] == pytest.approx(4 * 1.0 + 1 * 2.0)
    assert total["node_hours"] == pytest.approx(2 * 1.0 + 1 * 2.0)  # 4 GPUs on 2-GPU nodes
    assert total["requested_gpu_hours"] == pytest.approx(1.5 * 6.0)
    assert "sacct elapsed where available" in total["source"]


def test_full_training_at_measured_throughput():
    settings_ = analysis(full_training_epochs=10, train_images=36_000, overhead_factor=1.0)
    scaling = pd.DataFrame([{"mode": "strong", "world_size": 4, "images_per_s_mean": 100.0, "repeats": 3}])
    (row,) = resources.full_training_rows(scaling, settings_)
    assert row["wall_hours"] == pytest.approx(10 * 36_000 / 100 / 3600)  # 1 hour
    assert (row["gpu_hours"], row["node_hours"], row["nodes"]) == (pytest.approx(4.0), pytest.approx(2.0), 2)


def test_model_rows_only_for_unmeasured_sizes():
    settings_ = analysis(model_world_sizes=[4, 16])
    runs = pd.DataFrame([run_row("scaling", n, 256, 0.1 + 0.01 * (n - 1), mode="weak") for n in (1, 2, 4)])
    _, _, prediction = commmodel.analyse(runs, settings_)
    scaling = metrics.scaling_table(metrics.run_metrics(runs, settings_), settings_)
    table = resources.estimate(runs, scaling, prediction, settings_)
    model = table[table["scope"] == "model"]
    assert list(model["world_size"]) == [16]  # 4 was measured
    link = settings_["comm_model"]["interconnects"][0]["name"]
    assert model["source"].iloc[0] == f"model: {link} (configured; no collective benchmark)"
    assert model["nodes"].iloc[0] == 8


def test_model_rows_use_the_measured_collectives_where_the_benchmark_ran():
    settings_ = analysis(model_world_sizes=[16])
    runs = pd.DataFrame([run_row("scaling", n, 256, 0.1 + 0.01 * (n - 1), mode="weak") for n in (1, 2, 4)])
    bench = pd.DataFrame(
        [("all_reduce", 4, 2, "inter-node", 5e-6, 10.0, 0.99)],
        columns=["collective", "world_size", "nodes", "placement", "link_alpha_s", "bandwidth_gb_s", "r2"],
    )
    _, _, prediction = commmodel.analyse(runs, settings_, bench)
    scaling = metrics.scaling_table(metrics.run_metrics(runs, settings_), settings_)
    model = resources.estimate(runs, scaling, prediction, settings_).query("scope == 'model'").iloc[0]
    assert model["source"] == f"model: {commpredict.MEASURED_CURVE}"
    measured = prediction[
        (prediction["curve"] == commpredict.MEASURED_CURVE) & (prediction["world_size"] == 16)
    ]
    assert model["images_per_s"] == pytest.approx(256 * 16 / float(measured["step_s"].iloc[0]))


ONE_RUN = pd.DataFrame([run_row("scaling", 1, 8, 0.1, mode="weak")])


def scaling_rows(parallelism, unit="images", rate=100.0):
    return [
        {
            "mode": mode,
            "world_size": n,
            "images_per_s_mean": rate * n,
            "repeats": 1,
            "parallelism": parallelism,
            "sample_unit": unit,
        }
        for mode in ("weak", "strong")
        for n in (2, 1)
    ]


def test_one_training_row_per_mode_parallelism_and_size():
    settings_ = analysis(full_training_epochs=1, train_images=3600, overhead_factor=1.0)
    scaling = pd.DataFrame(scaling_rows("fsdp", rate=50.0) + scaling_rows("ddp"))
    table = resources.estimate(ONE_RUN, scaling, pd.DataFrame(), settings_)
    rows = table[table["scope"] == "full training"]
    assert list(table.columns).index("parallelism") == list(table.columns).index("mode") + 1
    assert list(zip(rows["mode"], rows["parallelism"], rows["world_size"], strict=True)) == [
        ("strong", "ddp", 1),
        ("strong", "ddp", 2),
        ("strong", "fsdp", 1),
        ("strong", "fsdp", 2),
        ("weak", "ddp", 1),
        ("weak", "ddp", 2),
        ("weak", "fsdp", 1),
        ("weak", "fsdp", 2),
    ]
    fsdp_two = rows[(rows["parallelism"] == "fsdp") & (rows["world_size"] == 2)].iloc[0]
    assert fsdp_two["wall_hours"] == pytest.approx(3600 / 100.0 / 3600)  # 50 samples/s per rank x 2
    assert (rows["what"] == "1 epochs").all()  # images: as the ResNet's tables always said


def test_a_single_parallelism_has_no_parallelism_column():
    scaling = pd.DataFrame(scaling_rows("ddp"))
    table = resources.estimate(ONE_RUN, scaling, pd.DataFrame(), analysis())
    assert "parallelism" not in table.columns
    assert list(table.columns) == list(resources.COLUMNS)


def test_an_lm_counts_tokens_in_model_rows_and_words():
    """Model rows convert the predicted step time to tokens/s: tokens per sequence x sequences/s."""
    settings_ = analysis(model_world_sizes=[16], train_images=1_000_000)
    runs = pd.DataFrame([run_row("scaling", n, 8, 0.1 + 0.01 * (n - 1), mode="weak") for n in (1, 2, 4)])
    _, _, prediction = commmodel.analyse(runs, settings_)
    scaling = metrics.scaling_table(metrics.run_metrics(runs, settings_), settings_)
    as_tokens = scaling.assign(
        sample_unit="tokens",
        images_per_s_mean=scaling["images_per_s_mean"] * 128,
        images_per_s_per_gpu_mean=scaling["images_per_s_per_gpu_mean"] * 128,
    )
    table = resources.estimate(runs, as_tokens, prediction, settings_)
    model = table[table["scope"] == "model"].iloc[0]
    link = settings_["comm_model"]["interconnects"][0]["name"]
    at_16 = prediction[(prediction["curve"] == link) & (prediction["world_size"] == 16)]
    step = float(at_16["step_s"].iloc[0])
    assert model["images_per_s"] == pytest.approx(128 * 8 * 16 / step)
    assert model["what"] == "200 epochs of 1,000,000 tokens"
    assert resources.units_per_sample(as_tokens, "tokens") == pytest.approx(128)


# -- energy: kWh beside the GPU-hours --


def test_grid_kwh_is_the_runs_measured_energy():
    runs = pd.DataFrame(
        [
            run_row("scaling", 4, 64, 0.1, mode="strong", energy_j=3.6e6, energy_source="counter"),
            run_row("scaling", 1, 256, 0.1, mode="strong", energy_j=7.2e6, energy_source="counter"),
        ]
    )
    total = pd.DataFrame(resources.grid_rows(runs, 2, 1.0)).set_index("what").loc["whole grid"]
    assert total["kwh"] == pytest.approx(3.0) and total["energy_source"].startswith("measured")


def test_grid_kwh_is_not_measured_where_a_run_lacks_energy_unless_a_power_is_assumed():
    runs = pd.DataFrame(
        [
            run_row("scaling", 4, 64, 0.1, mode="strong", energy_j=3.6e6, energy_source="counter"),
            run_row(
                "scaling",
                1,
                256,
                0.1,
                mode="strong",
                energy_source="not measured: no NVIDIA GPU (device cpu)",
            ),
        ]
    )
    total = pd.DataFrame(resources.grid_rows(runs, 2, 1.0)).set_index("what").loc["whole grid"]
    assert pd.isna(total["kwh"])  # never a partial sum, never a zero
    assert (
        total["energy_source"]
        == "not measured: 1 of 2 runs without energy (not measured: no NVIDIA GPU (device cpu))"
    )
    assumed = pd.DataFrame(resources.grid_rows(runs, 2, 1.0, assumed_w=500.0)).set_index("what")
    whole = assumed.loc["whole grid"]
    assert whole["kwh"] == pytest.approx(whole["gpu_hours"] * 0.5)  # 500 W per GPU
    assert whole["energy_source"].startswith("assumed: 500 W per GPU")


def test_full_training_kwh_at_the_points_measured_power_and_model_rows_per_gpu():
    settings_ = analysis(
        full_training_epochs=10, train_images=36_000, overhead_factor=1.0, model_world_sizes=[16]
    )
    runs = pd.DataFrame([run_row("scaling", n, 256, 0.1 + 0.01 * (n - 1), mode="weak") for n in (1, 2, 4)])
    _, _, prediction = commmodel.analyse(runs, settings_)
    scaling = metrics.scaling_table(metrics.run_metrics(runs, settings_), settings_)
    scaling["mean_power_w_mean"] = 600.0 * scaling["world_size"]  # 600 W per GPU, measured
    table = resources.estimate(runs, scaling, prediction, settings_)
    full = table[table["scope"] == "full training"]
    assert full["kwh"].to_numpy() == pytest.approx((full["wall_hours"] * 0.6 * full["world_size"]).to_numpy())
    assert full["energy_source"].str.startswith("measured power").all()
    model = table[table["scope"] == "model"].iloc[0]
    assert model["kwh"] == pytest.approx(model["gpu_hours"] * 0.6)
    assert model["energy_source"].startswith("estimate: 600 W per GPU")


def test_without_measured_power_the_kwh_say_not_measured_and_why():
    settings_ = analysis(model_world_sizes=[16])
    runs = pd.DataFrame([run_row("scaling", n, 256, 0.1, mode="weak") for n in (1, 2)])
    _, _, prediction = commmodel.analyse(runs, settings_)
    scaling = metrics.scaling_table(metrics.run_metrics(runs, settings_), settings_)
    table = resources.estimate(runs, scaling, prediction, settings_)
    assert table["kwh"].isna().all()
    assert table["energy_source"].str.startswith("not measured").all()
    assert "no energy_source column" in table.loc[table["scope"] == "full training", "energy_source"].iloc[0]
    assumed = resources.estimate(
        runs,
        scaling,
        prediction,
        {**settings_, "resources": {**settings_["resources"], "assumed_gpu_power_w": 300.0}},
    )
    assert assumed["kwh"].to_numpy() == pytest.approx((assumed["gpu_hours"] * 0.3).to_numpy())
    assert assumed["energy_source"].str.startswith("assumed: 300 W per GPU").all()
