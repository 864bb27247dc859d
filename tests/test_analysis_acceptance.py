"""Acceptance criteria: pass / fail against the config, and no fake pass at sizes not measured."""

from __future__ import annotations

import pandas as pd
import pytest

from scalestudy.analysis import acceptance, metrics, settings
from scalestudy.analysis.constructed_study import run_row

SETTINGS = settings.resolved({})
CRITERIA = SETTINGS["acceptance"]


def scaling_table(worlds, strong_eff, weak_growth, repeats=1):
    """Strong runs with efficiency `strong_eff` and weak runs whose step time grows by `weak_growth`."""
    rows = []
    for r in range(repeats):
        wiggle = 1 + 0.01 * r
        for n in worlds:
            rows.append(
                run_row(
                    "scaling",
                    n,
                    1024 // n,
                    0.2 * wiggle / (1 if n == 1 else strong_eff * n),
                    mode="strong",
                    repeat=r,
                )
            )
            rows.append(
                run_row(
                    "scaling",
                    n,
                    256,
                    0.1 * wiggle * (1 if n == 1 else 1 + weak_growth),
                    mode="weak",
                    repeat=r,
                )
            )
    runs = metrics.run_metrics(pd.DataFrame(rows), SETTINGS)
    return metrics.scaling_table(runs, SETTINGS)


def sensitivity_table(gain):
    rows = [
        run_row("baseline", 1, 128, 128 / 1000),
        run_row("sensitivity", 8, 256, 256 / (1000 * (1 + gain)), **{"config.bucket_cap_mb": 100}),
    ]
    return metrics.sensitivity_table(metrics.run_metrics(pd.DataFrame(rows), SETTINGS))


def evaluate(worlds, strong_eff=0.8, weak_growth=0.05, gain=0.3, repeats=1):
    table = acceptance.evaluate(
        scaling_table(worlds, strong_eff, weak_growth, repeats), sensitivity_table(gain), CRITERIA
    )
    return table.set_index("criterion")


def test_all_pass_when_measured_and_good():
    table = evaluate([1, 2, 4, 8])
    assert list(table["status"]) == ["pass", "pass", "pass"]
    assert table.loc["strong-scaling efficiency at 8 GPUs", "measured"] == pytest.approx(0.8)
    assert table.loc["weak-scaling step-time variation over N <= 8", "measured"] == pytest.approx(0.05)
    gain_row = table.loc["throughput gain per GPU of the best optimisation over the baseline"]
    assert gain_row["measured"] == pytest.approx(0.3)


@pytest.mark.parametrize(
    ("kwargs", "criterion"),
    [
        ({"strong_eff": 0.6}, "strong-scaling efficiency at 8 GPUs"),
        ({"weak_growth": 0.2}, "weak-scaling step-time variation over N <= 8"),
        ({"gain": 0.1}, "throughput gain per GPU of the best optimisation over the baseline"),
    ],
)
def test_each_criterion_can_fail(kwargs, criterion):
    table = evaluate([1, 2, 4, 8], **kwargs)
    assert table.loc[criterion, "status"] == "fail"
    assert (table.drop(index=criterion)["status"] == "pass").all()


def test_demo_grid_is_not_measured_never_a_pass():
    table = evaluate([1, 2])
    assert table.loc["strong-scaling efficiency at 8 GPUs", "status"] == "not measured (largest N=2)"
    assert table.loc["weak-scaling step-time variation over N <= 8", "status"] == "not measured (largest N=2)"
    informative = table.loc["strong-scaling efficiency at largest measured N=2"]
    assert informative["status"] == "informative"
    assert informative["measured"] == pytest.approx(0.8)
    assert "meets the threshold" in informative["note"]
    assert table.loc["weak-scaling step-time variation over measured N <= 2", "status"] == "informative"


def test_larger_grid_adds_an_informative_row_at_its_largest_size():
    table = evaluate([1, 2, 4, 8, 16])
    assert table.loc["strong-scaling efficiency at 8 GPUs", "status"] == "pass"
    assert table.loc["strong-scaling efficiency at largest measured N=16", "status"] == "informative"


def test_confidence_interval_is_reported_and_judged():
    table = evaluate([1, 2, 4, 8], strong_eff=0.7, repeats=3)
    row = table.loc["strong-scaling efficiency at 8 GPUs"]
    assert row["ci_low"] < row["measured"] < row["ci_high"]
    assert "not decisive" in row["note"]


def test_size_inside_the_range_but_absent_is_not_measured():
    table = evaluate([1, 2, 4, 16])
    assert (
        table.loc["strong-scaling efficiency at 8 GPUs", "status"] == "not measured (N=8 is not in the grid)"
    )
    assert (
        table.loc["weak-scaling step-time variation over N <= 8", "status"]
        == "not measured (N=8 is not in the grid)"
    )


def test_one_gpu_only_has_no_informative_row():
    table = evaluate([1])
    assert "informative" not in set(table["status"])
    assert table.loc["strong-scaling efficiency at 8 GPUs", "status"] == "not measured (largest N=1)"


def test_missing_stages_are_not_measured():
    empty = pd.DataFrame(columns=["mode", "world_size", "efficiency_mean", "time_per_step_s_mean"])
    no_sweep = pd.DataFrame(columns=["gain_vs_baseline", "images_per_s_per_gpu"])
    table = acceptance.evaluate(empty, no_sweep, CRITERIA)
    assert (table["status"] == "not measured").all()


def test_html_colours_status(tmp_path):
    html = acceptance.to_html(evaluate([1, 2]).reset_index())
    assert html.count("<tr style=") == 5
    assert "not measured (largest N=2)" in html and "n/a" in html


# --- series (DDP, FSDP) and units --------------------------------------------------------------


def two_series(worlds=(1, 2, 4, 8)):
    """A DDP series at 80 % strong efficiency and an FSDP one at 50 %, rows shuffled."""
    ddp = scaling_table(worlds, strong_eff=0.8, weak_growth=0.05).assign(parallelism="ddp")
    fsdp = scaling_table(worlds, strong_eff=0.5, weak_growth=0.4).assign(parallelism="fsdp")
    return pd.concat([fsdp, ddp], ignore_index=True).sample(frac=1.0, random_state=1)


def test_each_series_is_judged_on_its_own_ddp_first():
    table = acceptance.evaluate(two_series(), sensitivity_table(0.3), CRITERIA)
    assert list(table["criterion"][:4]) == [
        "strong-scaling efficiency at 8 GPUs (DDP)",
        "strong-scaling efficiency at 8 GPUs (FSDP)",
        "weak-scaling step-time variation over N <= 8 (DDP)",
        "weak-scaling step-time variation over N <= 8 (FSDP)",
    ]
    rows = table.set_index("criterion")
    assert rows.loc["strong-scaling efficiency at 8 GPUs (DDP)", "measured"] == pytest.approx(0.8)
    assert rows.loc["strong-scaling efficiency at 8 GPUs (DDP)", "status"] == "pass"
    assert rows.loc["strong-scaling efficiency at 8 GPUs (FSDP)", "measured"] == pytest.approx(0.5)
    assert rows.loc["strong-scaling efficiency at 8 GPUs (FSDP)", "status"] == "fail"
    assert rows.loc["weak-scaling step-time variation over N <= 8 (FSDP)", "measured"] == pytest.approx(0.4)


def test_informative_rows_name_their_series():
    table = acceptance.evaluate(two_series((1, 2)), sensitivity_table(0.3), CRITERIA).set_index("criterion")
    assert table.loc["strong-scaling efficiency at largest measured N=2 (FSDP)", "measured"] == pytest.approx(
        0.5
    )
    assert table.loc["strong-scaling efficiency at largest measured N=2 (DDP)", "status"] == "informative"


def test_a_single_series_keeps_its_names():
    scaling = scaling_table([1, 2, 4, 8], 0.8, 0.05).assign(parallelism="ddp")
    names = set(acceptance.evaluate(scaling, sensitivity_table(0.3), CRITERIA)["criterion"])
    assert "strong-scaling efficiency at 8 GPUs" in names
    assert not any("(DDP)" in name for name in names)


def test_the_gain_note_speaks_the_sample_unit_and_names_further_axes():
    resnet = acceptance.evaluate(scaling_table([1, 2], 0.8, 0.05), sensitivity_table(0.3), CRITERIA)
    note = resnet.set_index("criterion").loc[
        "throughput gain per GPU of the best optimisation over the baseline"
    ]
    assert note["note"].startswith("best point bf16, per-GPU batch 256, bucket 100 MB at N=8:")
    assert note["note"].endswith("images/s per GPU (one run each)")
    lm = sensitivity_table(0.3).assign(parallelism=None, sample_unit="tokens")  # an axis after "best"
    table = acceptance.evaluate(scaling_table([1, 2], 0.8, 0.05), lm, CRITERIA)
    note = table.set_index("criterion").loc[
        "throughput gain per GPU of the best optimisation over the baseline"
    ]
    assert "bucket 100 MB, parallelism ddp at N=8" in note["note"]  # empty: the default, DDP
    assert note["note"].endswith("tokens/s per rank (one run each)")


def test_the_loader_row_is_a_ratio_read_in_times_not_a_percentage():
    """The demo's loader row read '5247.0%': the loader alone was 52 times the training rate."""
    scaling = pd.DataFrame({"mode": ["strong"], "world_size": [2], "images_per_s_per_gpu_mean": [1000.0]})
    io_result = {"loader": {"loader": "tensor", "images_per_s": 52_470.0, "device": "cpu"}}
    (row,) = acceptance.loader_rows(io_result, scaling)
    assert row["target"] == ">= 1x" and row["measured"] == pytest.approx(52.47)
    assert acceptance.format_measured(row["measured"], row["target"]) == "52.5x"
    assert acceptance.format_measured(0.93, ">= 70%") == "93.0%"  # the other rows as they were
    assert acceptance.format_measured(12.3, ">= 20 GB/s") == "12.3 GB/s"
    html = acceptance.to_html(pd.DataFrame([row]))
    assert "<td>52.5x</td>" in html and "5247" not in html
    from scalestudy.paper import tables

    latex = tables.acceptance_table(pd.DataFrame([row]))
    assert "& 52.5x &" in latex and "5247" not in latex
