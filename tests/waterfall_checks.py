"""The checks of a CPU study's waterfall (tests/test_waterfall.py's constructed studies, and the real demo
of tests/test_workflow.py): every row adds up, every part is what runs.csv's raw step parts, scaling.csv and
the profile's overlap give, and the paper's paragraph holds the table's numbers."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pandas as pd
import pytest

from scalestudy.analysis import above_ideal, waterfall


def assert_adds_up(table: pd.DataFrame) -> None:
    """Every split row's parts and remainder add up to its loss; a row left unsplit has no loss (at
    or above the ideal, or one rank) and its note says why."""
    split = table["remainder_s"].notna()
    assert (table.loc[split, "loss_s"] > 0).all()  # never parts against no loss, or a negative one
    unsplit = table[~split]
    assert ((unsplit["loss_s"] <= 0) | (unsplit["world_size"] == 1)).all()
    assert unsplit["remainder_share"].isna().all() and not unsplit["unexplained_flagged"].any()
    for _, row in unsplit.iterrows():
        above = row["efficiency"] > 1.0
        assert bool(row["efficiency_above_ideal"]) == above
        assert (above_ideal.NOTE in row["note"]) == above and row["note"]
    for unit in ("s", "points"):
        parts = table[[f"{part}_{unit}" for part in waterfall.PARTS]].fillna(0.0).sum(axis=1)
        np.testing.assert_allclose(
            (parts + table[f"remainder_{unit}"])[split], table.loc[split, f"loss_{unit}"], rtol=1e-12
        )
    np.testing.assert_allclose(table["loss_points"], 100 * (1 - table["efficiency"]), rtol=1e-12)


def _lists(run: pd.Series, key: str) -> np.ndarray | None:
    cell = run.get(waterfall.STEP_PARTS + key)
    return None if pd.isna(cell) else np.asarray(json.loads(cell), dtype=float)


def check_cpu_waterfall(
    runs: pd.DataFrame, scaling: pd.DataFrame, overlap: pd.DataFrame, table: pd.DataFrame
):
    """A CPU study's waterfall at world sizes 1 and 2 (the demo's), recomputed from runs.csv's raw
    step parts, scaling.csv's efficiency and the profile's overlap.csv: every row adds up, every
    part is what the raw measurements give, host overhead is not measured (no device timeline)."""
    assert sorted(zip(table["mode"], table["world_size"], strict=True)) == [("strong", 2), ("weak", 2)]
    assert_adds_up(table)
    for _, row in table.iterrows():
        mode = row["mode"]
        series = runs[(runs["stage"] == "scaling") & (runs["config.mode"] == mode)]
        (at,) = (r for _, r in series[series["world_size"] == 2].iterrows())
        (one,) = (r for _, r in series[series["world_size"] == 1].iterrows())
        step, data, gradient = (_lists(at, key) for key in ("step_s", "data_wait_s", "gradient_wait_s"))
        assert len(step) == len(data) == len(gradient) == 2  # every rank's, gathered
        assert ((gradient > 0) & (gradient < step)).all() and ((data >= 0) & (data < step)).all()
        assert _lists(at, "device_busy_s") is None and _lists(one, "device_busy_s") is None
        reference_share = 0.5 if mode == "strong" else 1.0  # of the 1-rank reference's data wait
        want_data = np.median(data) - reference_share * np.median(_lists(one, "data_wait_s"))
        own = step - gradient
        assert row["data_wait_s"] == pytest.approx(want_data, rel=1e-9, abs=1e-15)
        assert row["straggler_s"] == pytest.approx(abs(own[0] - own[1]) / 2, rel=1e-9, abs=1e-15)
        assert np.isnan(row["host_overhead_s"]) and row["host_overhead_how"] == waterfall.NO_DEVICE_TIMELINE
        profiled = overlap[overlap["world_size"] == 2]
        exposed = (profiled["exposed_communication_s"] / profiled["steps"]).mean()
        assert row["exposed_comm_how"].startswith("profile at N=2")
        assert row["exposed_comm_s"] == pytest.approx(exposed, rel=1e-9, abs=1e-15) and exposed >= 0
        (point,) = scaling[(scaling["mode"] == mode) & (scaling["world_size"] == 2)].itertuples()
        assert row["efficiency"] == pytest.approx(point.efficiency_mean, rel=1e-9)
        assert row["step_time_s"] == pytest.approx(point.time_per_step_s_mean, rel=1e-9)
        share = row["remainder_s"] / row["loss_s"] if row["loss_s"] > 0 else math.nan  # no loss: no share
        assert row["remainder_share"] == pytest.approx(share, rel=1e-9, nan_ok=True)
        assert row["unexplained_flagged"] == (abs(row["remainder_share"]) > row["unexplained_share_max"])
        assert row["runs"] == f"scaling/{at['point']}; 1-rank reference: scaling/{one['point']}"


def check_cpu_waterfall_paper(table: pd.DataFrame, numbers_tex: str, paper_tex: str) -> None:
    """The paper's waterfall paragraph: its numbers are numbers.tex's macros, the CPU's missing
    host overhead is said, and a remainder beyond its bound is named."""
    value = dict(re.findall(r"^\\newcommand\{\\(Waterfall[A-Za-z]+)\}\{(.*)\}%", numbers_tex, re.M))
    for mode in ("strong", "weak"):
        row = table[table["mode"] == mode].iloc[0]
        Mode = mode.capitalize()
        assert value[f"Waterfall{Mode}World"] == "2" and value[f"Waterfall{Mode}Host"] == "not measured"
        assert value[f"Waterfall{Mode}Loss"] == f"{row['loss_points']:.2g}"
        summary = value[f"Waterfall{Mode}Summary"]
        assert summary.startswith(f"In {mode} scaling at 2 CPU ranks")
        if row["loss_points"] > 0:
            assert "host and launch overhead was not measured (on the CPU: no device timeline)" in summary
        elif row["efficiency"] > 1.0:  # a loaded machine may measure the 2-rank point above its ideal
            assert "above the ideal; check it: either a measurement problem" in summary
            assert "no loss to split" in summary
            assert value[f"Waterfall{Mode}RemainderShare"] == "none: no loss to split"
        else:
            assert "no efficiency is lost against the ideal" in summary
    bound = f"{100 * table['unexplained_share_max'].iloc[0]:.0f}\\,\\%"
    if table["remainder_share"].isna().all():  # no point had a loss to split: the summaries say why
        assert value["WaterfallUnexplained"] == ""
    elif table["unexplained_flagged"].any():
        assert value["WaterfallUnexplained"].startswith(f"The remainder exceeds {bound} of the loss at")
        for _, row in table[table["unexplained_flagged"]].iterrows():
            assert f"{row['mode']} scaling at 2 CPU ranks" in value["WaterfallUnexplained"]
    else:
        assert (
            value["WaterfallUnexplained"] == f"At every point the remainder stays within {bound} of the loss."
        )
    section = paper_tex[paper_tex.index(r"\section{Where the efficiency goes}") :]
    section = section[: section.index(r"\section", 1)]
    for macro in (r"\WaterfallStrongSummary", r"\WaterfallWeakSummary", r"\WaterfallUnexplained"):
        assert macro in section
    assert "figures/waterfall.pdf" in section
