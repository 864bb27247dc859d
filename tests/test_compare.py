"""Two studies compared point by point (scalestudy.compare), on constructed studies with repeats."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pandas as pd
import pytest

from scalestudy import compare
from scalestudy.analysis import aggregate, stats
from scalestudy.analysis import constructed_study as constructed
from scalestudy.compare import __main__ as compare_cli
from scalestudy.compare import points
from scalestudy.plan import studyconfig

REPO = Path(__file__).resolve().parents[1]
SCALED = ("strong/w2_r", "weak/w1_r")  # the points whose throughput the copy scales by 0.8


def write_study(root: Path, repeats: int = 3) -> Path:
    """A constructed demo-shaped study with `repeats` repeats and step-time noise: root/results/."""
    config = studyconfig.load(REPO / "config/demo.yaml")
    config["scaling"]["repeats"] = repeats
    folders = constructed.make_study(root, config, constructed.Truth(gpu=False, noise=0.03, seed=3))
    catalog = aggregate.build_catalog([folder / "summary.json" for folder in folders])
    (root / "results/tables").mkdir(parents=True, exist_ok=True)
    catalog.to_csv(root / "results/tables/runs.csv", index=False)
    return root / "results"


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    return write_study(tmp_path_factory.mktemp("a"))


def edited_copy(reference: Path, dest: Path, edit) -> Path:
    shutil.copytree(reference.parent, dest)
    runs = pd.read_csv(dest / "results/tables/runs.csv")
    runs = edit(runs)
    runs.to_csv(dest / "results/tables/runs.csv", index=False)
    return dest / "results"


def run_compare(a: Path, b: Path, *args: str) -> pd.DataFrame:
    table = a.parent / f"comparison-{b.parent.name}.csv"
    assert compare_cli.main([str(a), str(b), "--table", str(table), *args]) == 0
    return pd.read_csv(table)


def test_a_study_compared_with_itself_shows_no_difference_anywhere(reference):
    """Every point with repeats: no significant difference; a point run once (baseline, sensitivity,
    profile) has nothing to test: ratio 1, "not tested". Every ratio is 1."""
    table = run_compare(reference, reference)
    assert len(table) > 10 and set(table["match"]) == {"same run config"}
    repeated = table["repeats_a"].ge(2)
    assert repeated.sum() == 4 and set(table.loc[repeated, "verdict"]) == {points.SAME}
    assert table.loc[~repeated, "verdict"].str.startswith(points.NOT_TESTED).all()
    assert (table["repeats_a"] == table["repeats_b"]).all()
    for metric in ("throughput", "step_time", "accuracy"):
        assert table[f"{metric}_ratio"].dropna().eq(1.0).all(), metric
        assert len(table[f"{metric}_ratio"].dropna()) == len(table), metric
    scaling = table[table["stage"] == "scaling"]
    assert (scaling["efficiency_ratio"] == 1.0).all()
    tested = table[repeated]
    assert (tested["throughput_ratio_ci_low"] < 1.0).all() and (
        tested["throughput_ratio_ci_high"] > 1.0
    ).all()


def test_a_copy_slowed_at_some_points_is_flagged_slower_exactly_there(reference, tmp_path):
    def slow_some_and_drop_one(runs: pd.DataFrame) -> pd.DataFrame:
        scaled = runs["point"].str.startswith(SCALED)
        for column in ("images_per_s", "images_per_s_per_gpu"):
            runs.loc[scaled, column] *= 0.8
        return runs[runs["point"] != "strong/w1_r1"].reset_index(drop=True)  # one repeat less
        # (the point keeps two repeats; the sensitivity point below goes entirely)

    def edit(runs):
        runs = slow_some_and_drop_one(runs)
        gone = runs["stage"].eq("sensitivity") & runs["point"].eq("bf16/bs32_bucket25")
        return runs[~gone].reset_index(drop=True)

    slower = edited_copy(reference, tmp_path / "b", edit)
    table = run_compare(reference, slower)
    flagged = table[table["verdict"] == points.SLOWER]
    assert sorted(flagged["point"]) == ["strong/w2", "weak/w1"]
    assert (flagged["throughput_ratio"].round(9) == 0.8).all()
    assert (flagged["throughput_ratio_ci_low"] < 0.8).all() and (
        flagged["throughput_ratio_ci_high"] > 0.8
    ).all()
    assert (flagged["throughput_ratio_ci_high"] < 1.0).all()
    others = table[~table["point"].isin(["strong/w2", "weak/w1"]) & table["repeats_b"].ge(2)]
    assert len(others) == 2 and set(others["verdict"]) == {points.SAME}, others[["point", "verdict"]]
    untouched = table[table["repeats_b"].eq(1)]
    assert (
        untouched["throughput_ratio"].eq(1.0).all()
        and untouched["verdict"].str.startswith(points.NOT_TESTED).all()
    )
    missing = table[table["verdict"] == points.ONLY_A]
    assert list(missing["stage"] + "/" + missing["point"]) == ["sensitivity/bf16/bs32_bucket25"]
    assert table.loc[table["point"] == "strong/w1", "repeats_b"].item() == 2


def test_a_point_whose_run_config_differs_is_paired_and_the_key_named(reference, tmp_path):
    def change_lr(runs):
        runs.loc[runs["point"].str.startswith("weak/w2_r"), "config.lr"] = 0.123
        return runs

    other = edited_copy(reference, tmp_path / "lr", change_lr)
    table = run_compare(reference, other)
    row = table[table["point"] == "weak/w2"].squeeze()
    assert row["match"].startswith("run configs differ") and "lr" in row["match"] and "0.123" in row["match"]
    assert row["verdict"] == points.SAME  # the throughput is the same; the config difference is named
    assert not (table["verdict"].isin([points.ONLY_A, points.ONLY_B])).any()
    # The axis the studies are meant to differ in is not a difference: the points match as equal.
    table = run_compare(reference, other, "--axis", "lr")
    assert table.loc[table["point"] == "weak/w2", "match"].item() == "same run config"


def test_one_repeat_per_side_gives_a_ratio_but_no_verdict(tmp_path):
    single = write_study(tmp_path / "one", repeats=1)
    table = run_compare(single, single)
    assert table["verdict"].str.startswith(points.NOT_TESTED).all()
    assert table["throughput_ratio"].eq(1.0).all() and table["throughput_ratio_ci_low"].isna().all()


def test_energy_is_compared_where_both_sides_measured_it_and_said_not_measured_otherwise(reference, tmp_path):
    def with_energy(runs):
        runs["energy_j"] = 1000.0 + runs.index
        return runs

    measured = edited_copy(reference, tmp_path / "energy", with_energy)
    table = run_compare(measured, measured, "--summary", str(tmp_path / "summary.json"))
    assert table["energy_measured"].all() and (table["energy_ratio"] == 1.0).all()
    assert json.loads((tmp_path / "summary.json").read_text())["energy_measured"] is True
    table = run_compare(reference, measured)
    assert not table["energy_measured"].any() and table["energy_ratio"].isna().all()


def test_outputs_figure_markdown_and_summary(reference, tmp_path):
    out = {name: tmp_path / name for name in ("t.csv", "s.json", "c.md", "f.png", "f.pdf")}
    argv = [str(reference), str(reference), "--table", str(out["t.csv"]), "--summary", str(out["s.json"])]
    argv += ["--markdown", str(out["c.md"]), "--png", str(out["f.png"]), "--pdf", str(out["f.pdf"])]
    assert compare_cli.main(argv) == 0
    assert all(path.stat().st_size > 0 for path in out.values())
    info = json.loads(out["s.json"].read_text())
    assert info["same"] == 4 and info["same"] + info["not_tested"] == info["matched"] == info["points"]
    assert info["test"] == points.TEST and info["faster"] == info["slower"] == 0
    assert "Welch" in out["c.md"].read_text() and "no significant difference" in out["c.md"].read_text()


def test_a_study_that_cannot_be_read_is_named(tmp_path, capsys):
    assert compare_cli.main([str(tmp_path / "nowhere"), str(tmp_path)]) == 2
    assert "nowhere" in capsys.readouterr().err
    assert compare_cli.main([str(tmp_path), str(tmp_path)]) == 2
    assert "no run catalog" in capsys.readouterr().err


def test_the_ratio_interval_is_welchs_on_the_logarithms():
    a, b = [100.0, 104.0, 97.0, 101.0], [90.0, 95.0, 88.0]
    result = stats.ratio_interval(a, b, 0.95)
    la, lb = [math.log(x) for x in a], [math.log(x) for x in b]
    ma, mb = sum(la) / 4, sum(lb) / 3
    va = sum((x - ma) ** 2 for x in la) / 3 / 4
    vb = sum((x - mb) ** 2 for x in lb) / 2 / 3
    df = (va + vb) ** 2 / (va**2 / 3 + vb**2 / 2)
    half = stats.t_quantile(0.975, df) * math.sqrt(va + vb)
    assert result["ratio"] == pytest.approx(math.exp(mb - ma))
    assert result["df"] == pytest.approx(df)
    assert result["ci_low"] == pytest.approx(math.exp(mb - ma - half))
    assert result["ci_high"] == pytest.approx(math.exp(mb - ma + half))
    assert 0.0 < result["p_value"] < 0.05


def test_default_labels_name_the_study_not_its_results_folder(tmp_path):
    assert compare.default_label(tmp_path / "site-b" / "results") == "site-b"
    assert compare.default_label(tmp_path / "site-b" / "results" / "crate.zip") == "site-b"
    assert compare.default_label(tmp_path / "h100-run") == "h100-run"


def test_the_papers_comparison_macros(reference, tmp_path):
    from scalestudy.paper import numbers

    def slow(runs):
        runs.loc[runs["point"].str.startswith(SCALED), "images_per_s"] *= 0.8
        return runs

    slower = edited_copy(reference, tmp_path / "slow", slow)
    table = run_compare(reference, slower)
    macros = numbers.build({"comparison": table}, {"compared_with": "site A"}).macros
    values = {name: macro.value for name, macro in macros.items() if name.startswith("Compar")}
    assert values["ComparedWith"] == "site A" and values["ComparisonSlower"] == "2"
    assert values["ComparisonSame"] == "2" and values["ComparisonNotTested"] == "11"
    assert values["ComparisonOnlyHere"] == values["ComparisonOnlyThere"] == "0"
    assert values["ComparisonEnergy"] == "not measured"
    absent = {name: m.value for name, m in numbers.build({}, {}).macros.items() if name.startswith("Compar")}
    assert absent["ComparedWith"].startswith("no other study")
    assert absent["ComparisonSlower"] == "not measured"
    assert set(absent) == set(values)
