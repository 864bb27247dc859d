"""The alpha-beta all-reduce model: formula, honest fits, predictions."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from scalestudy.analysis import commmodel, commpredict, modelsize, settings
from scalestudy.analysis.constructed_study import run_row

ALPHA = 8e-6
BETA = 1 / 40e9
C = 20e-6  # compute seconds per image
GRAD = modelsize.gradient_bytes(64)


def runs_from_model(
    worlds, modes=("strong", "weak"), repeats=1, alpha=ALPHA, beta=BETA, noise=0.0, seed=0, bucket=25.0
) -> pd.DataFrame:
    """Scaling runs whose step times are exactly c b + ring all-reduce (times optional noise)."""
    rng = np.random.default_rng(seed)
    rows = []
    for mode in modes:
        for n in worlds:
            batch = 1024 // n if mode == "strong" else 256
            buckets = modelsize.bucket_count(GRAD, bucket)
            clean = C * batch + float(commpredict.ring_allreduce_s(n, GRAD, buckets, alpha, beta))
            for r in range(repeats):
                step = clean * (1 + noise * rng.standard_normal())
                rows.append(
                    run_row(
                        "scaling", n, batch, step, mode=mode, repeat=r, **{"config.bucket_cap_mb": bucket}
                    )
                )
    return pd.DataFrame(rows)


def fit_of(runs: pd.DataFrame, fixed_alpha: float = 10e-6) -> commpredict.Fit:
    points, compute = commmodel.fit_points(runs)
    return commmodel.fit(points, compute, fixed_alpha)


def test_ring_formula():
    assert float(commpredict.ring_allreduce_s(1, 1e9, 2, 1e-5, 1e-9)) == 0.0
    # N=2: 2(1)/2 * S * beta + 2 * 1 * k * alpha
    assert float(commpredict.ring_allreduce_s(2, 1e9, 2, 1e-5, 1e-9)) == pytest.approx(1.0 + 4e-5)
    # nccl-tests: busbw = algbw * 2(N-1)/N, so the time of S bytes at bus bandwidth B is 2(N-1)/N S/B
    n, size, busbw = 8, 44.7e6, 100e9
    assert float(commpredict.ring_allreduce_s(n, size, 1, 0.0, 1 / busbw)) == pytest.approx(
        size / (busbw * n / (2 * (n - 1)))
    )


def test_fit_recovers_alpha_and_beta():
    f = fit_of(runs_from_model([1, 2, 4, 8, 16]))
    assert f.method.startswith("free")
    assert f.alpha_s == pytest.approx(ALPHA, rel=1e-6)
    assert f.beta_s_per_byte == pytest.approx(BETA, rel=1e-6)
    assert f.dof == f.n_points - 2 == 8 - 2
    assert f.rms_residual_s == pytest.approx(0.0, abs=1e-12)
    assert f.compute_s_per_image["weak"] == pytest.approx(C)


def test_fit_with_noise_reports_uncertainty():
    f = fit_of(runs_from_model([1, 2, 4, 8, 16], repeats=3, noise=0.01))
    assert f.method.startswith("free")
    assert f.dof == f.n_points - 2
    assert f.rms_residual_s > 0
    assert 0 < f.alpha_se_s < math.inf and 0 < f.beta_se < math.inf
    assert abs(f.beta_s_per_byte - BETA) < 4 * f.beta_se  # within a few standard errors
    assert len(f.residuals) == f.n_points
    assert f.residuals["residual_s"].abs().max() > 0


def test_one_message_size_falls_back_to_fixed_alpha():
    """Worlds {1, 2} (the demo): alpha and beta cannot both be determined, so alpha is fixed."""
    f = fit_of(runs_from_model([1, 2]), fixed_alpha=ALPHA)
    assert "alpha fixed" in f.method and "one world size > 1" in f.method
    assert f.alpha_s == ALPHA
    assert f.beta_s_per_byte == pytest.approx(BETA, rel=1e-6)  # right alpha -> exact beta
    assert f.dof == 1  # two points (strong, weak), one parameter
    assert math.isnan(f.alpha_se_s)


def test_zero_degrees_of_freedom_is_said_plainly():
    f = fit_of(runs_from_model([1, 2], modes=("weak",)))
    assert f.dof == 0
    assert "dof 0" in f.method


def test_no_multi_gpu_runs_is_not_fitted():
    f = fit_of(runs_from_model([1]))
    assert f.method.startswith("not fitted")
    assert f.n_points == 0 and math.isnan(f.alpha_s)


def test_negative_estimate_is_clipped_and_said():
    f = fit_of(runs_from_model([1, 2, 4, 8, 16], alpha=-2e-6))
    assert "alpha clipped to 0" in f.method
    assert f.alpha_s == 0.0 and f.beta_s_per_byte > 0


def test_overlap_derived_from_measured_bandwidth():
    model = settings.resolved({"comm_model": {"measured_bandwidth_gb_s": 100.0}})["comm_model"]
    f = fit_of(runs_from_model([1, 2, 4, 8]))  # beta_eff = 1/40 GB/s
    phi, note = commmodel.overlap(f, model)
    assert phi == 0.0
    assert "clipped" in note  # 1 - 100/40 < 0: the measured link is slower than the data says
    model = settings.resolved({"comm_model": {"measured_bandwidth_gb_s": 20.0}})["comm_model"]
    phi, note = commmodel.overlap(f, model)
    assert phi == pytest.approx(1 - 20 / 40) and note.startswith("derived")


def test_predictions():
    analysis = settings.resolved({"comm_model": {"max_world": 64, "gpus_per_node": 8}})
    fit_table, residuals, prediction = commmodel.analyse(runs_from_model([1, 2, 4, 8]), analysis)
    assert set(prediction["curve"]) == {commpredict.FIT_CURVE} | {
        i["name"] for i in analysis["comm_model"]["interconnects"]
    }
    weak = prediction[prediction["mode"] == "weak"]
    one = weak[weak["world_size"] == 1]
    assert (one["efficiency"] == 1.0).all()
    for _, curve in weak.groupby("curve"):
        assert curve.sort_values("world_size")["efficiency"].is_monotonic_decreasing
    # Within one node every interconnect curve uses the intra-node link, so they coincide there.
    links = weak[(weak["curve"] != commpredict.FIT_CURVE) & (weak["world_size"] == 8)]
    assert links["efficiency"].nunique() == 1
    # The fitted curve reproduces the measured points exactly (noise-free data).
    fitted = weak[(weak["curve"] == commpredict.FIT_CURVE) & (weak["world_size"] == 4)]["efficiency"].iloc[0]
    step4 = C * 256 + float(commpredict.ring_allreduce_s(4, GRAD, 2, ALPHA, BETA))
    assert fitted == pytest.approx(C * 256 / step4)
    # Strong scaling stops where the global batch would give a GPU less than one image.
    strong = prediction[prediction["mode"] == "strong"]
    assert strong["world_size"].max() == 64
    assert set(fit_table["quantity"]) >= {"method", "degrees_of_freedom", "alpha_eff", "bandwidth_eff"}


def test_strong_prediction_stops_below_one_image_per_gpu():
    analysis = settings.resolved({"comm_model": {"max_world": 1024}})
    runs = runs_from_model([1, 2, 4], modes=("strong",))
    _, _, prediction = commmodel.analyse(runs, analysis)
    assert prediction["world_size"].max() == 1024  # global batch 1024: one image per GPU at 1024
    runs = runs.assign(per_gpu_batch=runs["per_gpu_batch"] // 2)  # global batch 512
    _, _, prediction = commmodel.analyse(runs, analysis)
    assert prediction["world_size"].max() == 512


def test_cli_writes_tables(tmp_path):
    runs_from_model([1, 2]).to_csv(tmp_path / "runs.csv", index=False)
    out = {name: tmp_path / f"{name}.csv" for name in ("fit", "residuals", "prediction")}
    commmodel.main(
        [
            "--runs",
            str(tmp_path / "runs.csv"),
            "--analysis-json",
            '{"comm_model": {"fit_alpha_us": 8}}',
            "--fit-out",
            str(out["fit"]),
            "--residuals-out",
            str(out["residuals"]),
            "--prediction-out",
            str(out["prediction"]),
        ]
    )
    fit = pd.read_csv(out["fit"]).set_index("quantity")
    assert "alpha fixed at 8 us" in fit.loc["method", "value"]
    assert float(fit.loc["alpha_eff", "value"]) == pytest.approx(8.0)
    assert float(fit.loc["bandwidth_eff", "value"]) == pytest.approx(40.0, rel=1e-6)
    assert len(pd.read_csv(out["residuals"])) == 2


# --- the measured collectives (scalestudy.preflight.collectives) in the model
# ------------------------------------


def bench_fit(rows):
    """comm_bench_fit.csv rows: (collective, world, nodes, placement, link alpha s, bus GB/s)."""
    columns = ["collective", "world_size", "nodes", "placement", "link_alpha_s", "bandwidth_gb_s", "r2"]
    return pd.DataFrame([(*row, 0.99) for row in rows], columns=columns)


MEASURED = bench_fit(
    [
        ("all_reduce", 2, 1, "intra-node", 2e-6, 150.0),
        ("all_reduce", 8, 1, "intra-node", 3e-6, 120.0),  # the largest intra-node size is used
        ("all_gather", 8, 1, "intra-node", 1e-6, 999.0),  # not all-reduce: ignored
        ("all_reduce", 16, 2, "inter-node", 6e-6, 40.0),
    ]
)


def test_measured_links_take_the_largest_all_reduce_per_placement():
    links = commpredict.measured_links(MEASURED)
    assert set(links) == {"intra-node", "inter-node"}
    assert links["intra-node"]["world_size"] == 8 and links["intra-node"]["bandwidth_gb_s"] == 120.0
    assert links["inter-node"]["link_alpha_s"] == 6e-6
    assert commpredict.measured_links(None) == {} and commpredict.measured_links(MEASURED.iloc[:0]) == {}


def test_measured_curve_is_the_ring_model_with_the_measured_link():
    analysis = settings.resolved({"comm_model": {"max_world": 64, "gpus_per_node": 8}})
    _, _, prediction = commmodel.analyse(runs_from_model([1, 2, 4, 8]), analysis, MEASURED)
    weak = prediction[(prediction["mode"] == "weak") & (prediction["curve"] == commpredict.MEASURED_CURVE)]
    weak = weak.set_index("world_size")
    grad, buckets = GRAD, modelsize.bucket_count(GRAD, 25.0)
    # measured_bandwidth_gb_s is null: phi comes from the benchmark's link at the largest size (8,
    # intra-node, 120 GB/s) and the fitted beta_eff (1/40 GB/s): 1 - 120/40 < 0 -> clipped to 0
    for n, (alpha, bandwidth) in {4: (3e-6, 120.0), 8: (3e-6, 120.0), 32: (6e-6, 40.0)}.items():
        comm = float(commpredict.ring_allreduce_s(n, grad, buckets, alpha, 1 / (bandwidth * 1e9)))
        assert weak.loc[n, "exposed_comm_s"] == pytest.approx(comm)
        assert weak.loc[n, "efficiency"] == pytest.approx(C * 256 / (C * 256 + comm))


def test_overlap_from_the_benchmark_when_not_configured():
    analysis = settings.resolved({"comm_model": {"max_world": 64, "gpus_per_node": 8}})
    slow = bench_fit([("all_reduce", 8, 1, "intra-node", 3e-6, 20.0)])
    table, _, prediction = commmodel.analyse(runs_from_model([1, 2, 4, 8]), analysis, slow)
    values = table.set_index("quantity")
    assert float(values.loc["overlap_fraction", "value"]) == pytest.approx(1 - 20 / 40)
    assert "from comm_bench, intra-node N=8" in values.loc["overlap_fraction", "note"]
    # only an intra-node size was measured: the curve says so and uses that link beyond a node too
    assert f"{commpredict.MEASURED_CURVE}, intra-node link only" in set(prediction["curve"])
    assert float(values.loc["measured_bandwidth[intra-node]", "value"]) == 20.0
    assert float(values.loc["measured_alpha[intra-node]", "value"]) == pytest.approx(3.0)
    configured = settings.resolved({"comm_model": {"gpus_per_node": 8, "measured_bandwidth_gb_s": 30.0}})
    table, _, _ = commmodel.analyse(runs_from_model([1, 2, 4, 8]), configured, slow)
    assert float(table.set_index("quantity").loc["overlap_fraction", "value"]) == pytest.approx(1 - 30 / 40)


def test_profile_allreduce_beside_the_benchmarks_prediction():
    overlap = pd.DataFrame(
        {
            "world_size": [1, 8, 8],
            "rank": [0, 0, 1],
            "tool": ["torch", "nsys", "nsys"],
            "communication_s": [0.0, 0.04, 0.06],
            "exposed_communication_s": [0.0, 0.01, 0.03],
            "steps": [10, 10, 10],
        }
    )
    analysis = settings.resolved({"comm_model": {"gpus_per_node": 8}})
    table, _, _ = commmodel.analyse(runs_from_model([1, 2, 4, 8]), analysis, MEASURED, overlap)
    values = table.set_index("quantity")["value"].astype(str)
    assert float(values["profile_allreduce_per_step[N=8]"]) == pytest.approx(5.0)  # (4 + 6) ms / 2 ranks
    assert float(values["profile_exposed_per_step[N=8]"]) == pytest.approx(2.0)
    buckets = modelsize.bucket_count(GRAD, 25.0)
    expected = float(commpredict.ring_allreduce_s(8, GRAD, buckets, 3e-6, 1 / 120e9)) * 1e3
    assert float(values["bench_allreduce_per_step[N=8]"]) == pytest.approx(expected)
    assert "profile_allreduce_per_step[N=1]" not in values  # one rank has no all-reduce


def test_cli_takes_the_benchmark_and_the_profile(tmp_path):
    runs_from_model([1, 2, 4]).to_csv(tmp_path / "runs.csv", index=False)
    MEASURED.to_csv(tmp_path / "bench.csv", index=False)
    out = {name: tmp_path / f"{name}.csv" for name in ("fit", "residuals", "prediction")}
    args = ["--runs", str(tmp_path / "runs.csv"), "--bench-fit", str(tmp_path / "bench.csv")]
    args += [f"--{name}-out={path}" for name, path in out.items()]
    assert commmodel.main([*args, "--analysis-json", '{"comm_model": {"gpus_per_node": 8}}']) == 0
    assert commpredict.MEASURED_CURVE in set(pd.read_csv(out["prediction"])["curve"])
    MEASURED.drop(columns="link_alpha_s").to_csv(tmp_path / "bench.csv", index=False)
    with pytest.raises(ValueError, match="bench.csv: missing column.*link_alpha_s"):
        commmodel.main([*args, "--analysis-json", "{}"])


def test_a_clipped_training_fit_does_not_derive_a_fully_hidden_all_reduce():
    """beta_eff clipped to 0 (the demo on a loaded machine): 1 - 0 x bandwidth would say phi = 1."""
    analysis = settings.resolved({"comm_model": {"gpus_per_node": 8, "overlap_fraction": 0.25}})
    runs = runs_from_model([1, 2], beta=-BETA)  # slower with one rank than with two: beta clipped
    table, _, _ = commmodel.analyse(runs, analysis, MEASURED)
    values = table.set_index("quantity")
    assert "beta clipped to 0" in values.loc["method", "value"]
    assert float(values.loc["overlap_fraction", "value"]) == 0.25
    assert "not derived from comm_bench" in values.loc["overlap_fraction", "note"]


# --- any workload, DDP and FSDP ------------------------------------------------------------------


def fsdp_runs(worlds, modes=("strong", "weak")) -> pd.DataFrame:
    """FSDP scaling runs far off the DDP model (3x its step times): they must not move the fit."""
    runs = runs_from_model(worlds, modes=modes)
    runs["images_per_s_per_gpu"] /= 3.0
    return runs.assign(parallelism="fsdp")


def test_the_fit_and_predictions_use_the_ddp_series_only():
    analysis = settings.resolved({"comm_model": {"max_world": 64, "gpus_per_node": 8}})
    ddp = runs_from_model([1, 2, 4, 8])
    alone = commmodel.analyse(ddp, analysis)
    mixed = pd.concat([fsdp_runs([1, 2, 4, 8]), ddp.assign(parallelism=None)], ignore_index=True)
    table, residuals, prediction = commmodel.analyse(mixed.sample(frac=1.0, random_state=3), analysis)
    values = table.set_index("quantity")
    assert float(values.loc["alpha_eff", "value"]) == pytest.approx(ALPHA / 1e-6, rel=1e-6)
    assert float(values.loc["bandwidth_eff", "value"]) == pytest.approx(40.0, rel=1e-6)
    assert values.loc["points", "value"] == 6  # the DDP multi-GPU runs (an empty parallelism is DDP)
    assert values.loc["runs_not_modelled", "value"] == 8  # every FSDP scaling run, 1 GPU included
    assert (
        "fsdp" in values.loc["runs_not_modelled", "note"] and "DDP" in values.loc["runs_not_modelled", "note"]
    )
    columns = ["mode", "curve", "world_size"]
    pd.testing.assert_frame_equal(
        prediction.sort_values(columns).reset_index(drop=True),
        alone[2].sort_values(columns).reset_index(drop=True),
    )
    assert len(residuals) == len(alone[1]) == 6
    # a DDP-only study's table has no such row (the ResNet's table is unchanged)
    assert "runs_not_modelled" not in set(alone[0]["quantity"])


def test_an_fsdp_only_study_is_not_fitted_and_says_why():
    table, residuals, prediction = commmodel.analyse(fsdp_runs([1, 2, 4]), settings.resolved({}))
    values = table.set_index("quantity")
    assert values.loc["method", "value"].startswith("not fitted")
    assert values.loc["runs_not_modelled", "value"] == 6
    assert residuals.empty and prediction.empty


def test_gradient_bytes_come_from_the_parameters_or_the_resnet_width():
    resnet = runs_from_model([1, 2])
    # no parameters column: the ResNet-18's closed form of config.width (64: 11,173,962 parameters)
    assert commmodel.gradient_bytes(resnet) == [4 * 11_173_962] * len(resnet)
    # the counted parameters agree with the closed form, so the ResNet's numbers do not move
    assert commmodel.gradient_bytes(resnet.assign(parameters=11_173_962)) == [4 * 11_173_962] * len(resnet)
    lm = resnet.drop(columns="config.width").assign(parameters=1_853_568)
    assert commmodel.gradient_bytes(lm) == [4 * 1_853_568] * len(lm)
    assert commmodel.gradient_bytes(lm.assign(**{"config.comm_hook": "bf16"})) == [2 * 1_853_568] * len(lm)
    with pytest.raises(
        ValueError, match="strong/w1_r0 has neither parameters nor a closed form of its model"
    ):
        commmodel.gradient_bytes(resnet.drop(columns="config.width"))


def lm_runs(worlds, parameters=2_000_000, tokens_per_sample=128, bucket=1.0) -> pd.DataFrame:
    """LM scaling runs: the rate counts tokens, the step time is the trainer's own (step_time_s)."""
    grad = 4.0 * parameters
    buckets = modelsize.bucket_count(grad, bucket)
    rows = []
    for mode in ("strong", "weak"):
        for n in worlds:
            batch = 64 // n if mode == "strong" else 8
            step = C * 100 * batch + float(commpredict.ring_allreduce_s(n, grad, buckets, ALPHA, BETA))
            tokens_per_s = batch * tokens_per_sample / step
            row = run_row("scaling", n, batch, step, mode=mode, **{"config.bucket_cap_mb": bucket})
            row.update(images_per_s_per_gpu=tokens_per_s, images_per_s=tokens_per_s * n, step_time_s=step)
            row.update(parameters=parameters, sample_unit="tokens", parallelism="ddp")
            del row["config.width"]
            rows.append(row)
    return pd.DataFrame(rows)


def test_an_lm_is_fitted_from_its_step_times_and_parameters():
    runs = lm_runs([1, 2, 4, 8])
    points, compute = commmodel.fit_points(runs)
    assert set(points["grad_bytes"]) == {8_000_000.0}
    assert compute["weak"] == pytest.approx(C * 100)  # seconds per sequence, not per token
    result = commmodel.fit(points, compute, 10e-6)
    assert result.alpha_s == pytest.approx(ALPHA, rel=1e-6)
    assert result.beta_s_per_byte == pytest.approx(BETA, rel=1e-6)
    table, _, _ = commmodel.analyse(runs, settings.resolved({}))
    compute_rows = table[table["quantity"].str.startswith("compute_per")].set_index("quantity")
    assert list(compute_rows.index) == ["compute_per_sample[strong]", "compute_per_sample[weak]"]
    assert "tokens" in compute_rows["note"].iloc[0]
