"""Two studies compared point by point (scalestudy.compare), on constructed studies with repeats."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import shutil
import statistics
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from scalestudy import compare
from scalestudy.analysis import aggregate, stats
from scalestudy.analysis import constructed_study as constructed
from scalestudy.compare import __main__ as compare_cli
from scalestudy.compare import points, pooled, spread
from scalestudy.plan import studyconfig
from tests.compare_studies import scale_throughput
from tests.conftest import REPO

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


@pytest.fixture(scope="module")
def once(tmp_path_factory) -> Path:
    """The constructed study with one repeat per point."""
    return write_study(tmp_path_factory.mktemp("once"), repeats=1)


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


def test_a_point_whose_run_config_differs_is_refused_in_one_line_unless_allowed(reference, tmp_path, capsys):
    def change_lr(runs):
        runs.loc[runs["point"].str.startswith("weak/w2_r"), "config.lr"] = 0.123
        return runs

    other = edited_copy(reference, tmp_path / "lr", change_lr)
    assert compare_cli.main([str(reference), str(other)]) == compare_cli.EXIT_NOT_THE_SAME
    captured = capsys.readouterr()
    refusal = [line for line in captured.err.splitlines() if line.startswith("compare:")]
    assert len(refusal) == 1 and "not the same experiment" in refusal[0], captured.err
    assert "lr (0.05 vs 0.123)" in refusal[0] and "--axis lr" in refusal[0] and not captured.out

    markdown = tmp_path / "c.md"
    table = run_compare(reference, other, "--allow-different", "--markdown", str(markdown))
    row = table[table["point"] == "weak/w2"].squeeze()
    assert row["match"] == points.CONFIGS_DIFFER and row["config_differences"] == "lr 0.05 vs 0.123"
    assert row["verdict"] == points.SAME  # the throughput is the same; the config difference is named
    assert not (table["verdict"].isin([points.ONLY_A, points.ONLY_B])).any()
    lines = markdown.read_text().splitlines()
    warnings = [line for line in lines if line.startswith("WARNING")]
    assert len(warnings) == 1 and lines.index(warnings[0]) == 2 and "lr (0.05 vs 0.123)" in warnings[0]
    rows = [line for line in lines if line.startswith("| scaling/weak/w2 ")]
    assert len(rows) == 1 and "configs differ [1]" in rows[0] and "0.123" not in rows[0]
    assert "[1] Run configs differ (A vs B): lr 0.05 vs 0.123." in lines
    # The axis the studies are meant to differ in is not a difference: the points match as equal.
    table = run_compare(reference, other, "--axis", "lr")
    assert table.loc[table["point"] == "weak/w2", "match"].item() == points.SAME_CONFIG


def test_a_key_left_at_the_trainers_default_is_no_difference(reference, tmp_path):
    def write_default(runs):
        runs["config.optimizer_impl"] = "auto"  # runconfig.DEFAULTS, written out in B only
        return runs

    other = edited_copy(reference, tmp_path / "explicit", write_default)
    table = run_compare(reference, other)
    assert set(table["match"]) == {points.SAME_CONFIG}


def test_one_repeat_per_side_gives_a_ratio_but_no_verdict(tmp_path):
    single = write_study(tmp_path / "one", repeats=1)
    table = run_compare(single, single)
    assert table["verdict"].str.startswith(points.NOT_TESTED).all()
    assert table["throughput_ratio"].eq(1.0).all() and table["throughput_ratio_ci_low"].isna().all()


SPREAD = (-1.5, -0.5, 0.5, 1.5)  # four sub-intervals around a run's throughput


def with_window(runs: pd.DataFrame, cv: float) -> pd.DataFrame:
    """Each run's steady-state window as four sub-interval rates spread by `cv` around its rate."""
    runs["interval_images_per_s"] = [
        json.dumps([r * (1 + cv * f) for f in SPREAD]) for r in runs["images_per_s"]
    ]
    runs["window_filled"] = True
    return runs


def slowed(runs: pd.DataFrame, factor: float = 0.8) -> pd.DataFrame:
    return scale_throughput(runs, runs["point"].str.startswith(SCALED), factor)


def test_one_repeat_per_side_is_judged_on_each_runs_window_spread(once, tmp_path):
    """One repeat: the interval from both runs' sub-interval spreads (one sub-interval's spread each,
    not the window mean's standard error), the slowed points called slower and named first."""
    single = edited_copy(once, tmp_path / "a", lambda r: with_window(r, 0.02))
    slow = edited_copy(single, tmp_path / "b", slowed)
    markdown = tmp_path / "c.md"
    table = run_compare(single, slow, "--markdown", str(markdown))
    assert set(table["verdict_basis"]) == {spread.WITHIN}
    flagged = table[table["verdict"] == points.SLOWER]
    assert (
        sorted(flagged["point"]) == ["strong/w2", "weak/w1"]
        and (flagged["throughput_ratio"].round(9) == 0.8).all()
    )
    assert set(table.loc[~table.index.isin(flagged.index), "verdict"]) == {points.SAME}

    row = flagged.iloc[0]
    logs = [math.log(1 + 0.02 * f) for f in SPREAD]  # the same spread on both sides: df 3 + 3
    half = stats.t_quantile(0.975, 6.0) * math.sqrt(2 * statistics.variance(logs))
    assert row["throughput_ratio_ci_low"] == pytest.approx(0.8 * math.exp(-half))
    assert row["throughput_ratio_ci_high"] == pytest.approx(0.8 * math.exp(half))
    text = markdown.read_text()
    first = text.split("\n")[3]
    assert (
        first.startswith("Points: 15")
        and "Slower in B: 2 (scaling/strong/w2 0.800, scaling/weak/w1 0.800)" in first
    )
    assert "within-run spread, one repeat" in text and "| slower (one repeat) |" in text


def test_one_repeat_with_a_noisy_window_gives_no_verdict_but_names_the_gap(once, tmp_path):
    single = edited_copy(once, tmp_path / "a", lambda r: with_window(r, 0.2))
    slow = edited_copy(single, tmp_path / "b", slowed)
    summary = tmp_path / "s.json"
    table = run_compare(single, slow, "--summary", str(summary))
    assert not table["verdict"].isin([points.SLOWER, points.FASTER]).any()
    info = json.loads(summary.read_text())
    assert [p["point"] for p in info["apart_without_verdict"]] == ["scaling/strong/w2", "scaling/weak/w1"]
    from scalestudy.paper import numbers

    macros = numbers.build({"comparison": table}, {"compared_with": "a"}).macros
    assert macros["ComparisonApart"].value == (
        "Apart by 10\\,\\% or more without a verdict: scaling/strong/w2 (0.8), scaling/weak/w1 (0.8)."
    )
    assert macros["ComparisonSlowerPoints"].value == "none"


def test_a_window_not_filled_gives_no_interval(once, tmp_path):
    def unfilled(runs):
        runs = with_window(runs, 0.02)
        runs["window_filled"] = runs["point"].ne("strong/w2_r0")
        runs["whole_run_images_per_s"] = runs["images_per_s"]  # what an unfilled window reports
        return runs

    single = edited_copy(once, tmp_path / "a", unfilled)
    table = run_compare(single, single)
    row = table[table["point"] == "strong/w2"].squeeze()
    assert row["throughput_ratio"] == 1.0 and math.isnan(row["throughput_ratio_ci_low"])
    assert row["verdict"].startswith(points.NOT_TESTED) and pd.isna(row["verdict_basis"])
    assert (table.loc[table["point"] != "strong/w2", "verdict"] == points.SAME).all()


def test_the_figure_has_a_legend_and_says_when_the_studies_differ(reference, tmp_path, monkeypatch):
    from scalestudy.compare import figure
    from scalestudy.plots import style

    drawn = {}
    monkeypatch.setattr(style, "save_figure", lambda fig, png, pdf=None: drawn.update(fig=fig))

    def change_lr(runs):
        runs.loc[runs["point"].str.startswith("weak/w2_r"), "config.lr"] = 0.123
        return runs

    other = edited_copy(reference, tmp_path / "lr", lambda runs: slowed(with_window(change_lr(runs), 0.02)))
    assert compare_cli.main([str(reference), str(other), "--allow-different", "--png", "x.png"]) == 0
    ax = drawn["fig"].axes[0]
    labels = [text.get_text() for text in ax.get_legend().get_texts()]
    assert "slower (repeats)" in labels and "no significant difference (repeats)" in labels
    assert any(label.startswith("not tested") for label in labels)
    assert ax.get_title(loc="left").startswith("NOT THE SAME EXPERIMENT") and "lr" in ax.get_title(loc="left")
    assert ax.get_xscale() == "log" and figure.COLOURS[points.SLOWER]


def test_labels_are_the_studys_name_from_its_crate_and_help_names_the_module(reference, tmp_path, capsys):
    crate = reference / "crate"
    crate.mkdir(exist_ok=True)
    # the crate's title is its root dataset's name; the study's name is in its effective config
    (crate / "ro-crate-metadata.json").write_text(json.dumps({"@graph": [{"@id": "./", "name": "A title"}]}))
    (crate / "config.json").write_text(json.dumps({"study": {"name": "site-a-h100", "title": "A title"}}))
    try:
        summary = tmp_path / "s.json"
        assert compare_cli.main([str(reference), str(reference.parent), "--summary", str(summary)]) == 0
        assert json.loads(summary.read_text())["a"]["label"] == "site-a-h100"
    finally:
        shutil.rmtree(crate)
    assert capsys.readouterr().out.startswith("# site-a-h100 (B) against site-a-h100 (A)")
    with pytest.raises(SystemExit):
        compare_cli.main(["--help"])
    assert capsys.readouterr().out.startswith("usage: python -m scalestudy.compare ")


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


def test_a_side_with_repeats_against_a_side_run_once_combines_both_spreads():
    """Repeats on A (the mean's standard error, df n - 1) against one run of B (one sub-interval's
    spread, df k - 1): Welch-Satterthwaite; with repeats on both sides, stats.ratio_interval itself."""
    a, b, windows = [100.0, 104.0, 97.0], [80.0], [76.0, 82.0, 79.0, 83.0]
    result = spread.throughput_interval(a, b, [], windows, 0.95)
    la, lw = [math.log(x) for x in a], [math.log(x) for x in windows]
    va, vb = statistics.variance(la) / 3, statistics.variance(lw)
    df = (va + vb) ** 2 / (va**2 / 2 + vb**2 / 3)
    diff = math.log(80.0) - statistics.fmean(la)
    half = stats.t_quantile(0.975, df) * math.sqrt(va + vb)
    assert result["basis"] == spread.WITHIN and result["df"] == pytest.approx(df)
    assert result["ci_low"] == pytest.approx(math.exp(diff - half))
    assert result["ci_high"] == pytest.approx(math.exp(diff + half))
    both = spread.throughput_interval(a, [90.0, 95.0, 88.0], windows, windows, 0.95)
    assert both == stats.ratio_interval(a, [90.0, 95.0, 88.0], 0.95) | {"basis": spread.REPEATS}
    assert spread.throughput_interval(a, b, [], [], 0.95)["basis"] == ""


def test_default_labels_name_the_study_not_its_results_folder(tmp_path):
    assert compare.default_label(tmp_path / "site-b" / "results") == "site-b"
    assert compare.default_label(tmp_path / "site-b" / "results" / "crate.zip") == "site-b"
    assert compare.default_label(tmp_path / "h100-run") == "h100-run"


def test_the_papers_comparison_says_when_the_studies_differ(reference, tmp_path):
    from scalestudy.paper import numbers

    def gpu_like(runs):
        runs["config.backend"], runs["config.width"] = "nccl", 64
        return runs

    other = edited_copy(reference, tmp_path / "gpu", gpu_like)
    table = run_compare(reference, other, "--allow-different")
    macros = numbers.build({"comparison": table}, {"compared_with": "gpu"}).macros
    sentence = macros["ComparisonNotSame"].value
    assert sentence.startswith("The two are not the same experiment: at 15 of 15 matched points")
    assert "backend (gloo vs nccl), width (8 vs 64)" in sentence


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
    assert values["ComparisonSlowerPoints"] == "scaling/strong/w2 (0.8), scaling/weak/w1 (0.8)"
    assert values["ComparisonFasterPoints"] == "none" and values["ComparisonNotSame"] == ""
    assert values["ComparisonBasis"].startswith("on the repeats at 4 points and on one repeat per side at 0")
    absent = {name: m.value for name, m in numbers.build({}, {}).macros.items() if name.startswith("Compar")}
    assert absent["ComparedWith"].startswith("no other study")
    assert absent["ComparisonSlower"] == "not measured" and absent["ComparisonNotSame"] == ""
    assert values["ComparisonApart"] == absent["ComparisonApart"] == ""
    assert set(absent) == set(values)


def every_point_times(runs: pd.DataFrame, factor: float, noise: float = 0.0, seed: int = 5) -> pd.DataFrame:
    """Every run's throughput times `factor`, each run also by its own lognormal noise of `noise`."""
    rng = np.random.default_rng(seed)
    for index in runs.index:
        own = factor * math.exp(rng.normal(0.0, noise)) if noise else factor
        runs = scale_throughput(runs, runs.index == index, own)
    return runs


def compare_study(a: Path, b: Path, tmp_path: Path, *args: str) -> tuple[int, dict, str, str]:
    """(exit status, summary, stdout, stderr) of `compare A B --summary ... ARGS` in this process."""
    summary = tmp_path / "summary.json"
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = compare_cli.main([str(a), str(b), "--summary", str(summary), *args])
    return status, json.loads(summary.read_text()), out.getvalue(), err.getvalue()


def test_a_copy_slower_everywhere_by_one_repeat_is_slower_at_the_study_level_and_fails_the_gate(
    once, tmp_path
):
    """Issue 54: one repeat a point, noisy windows (no point alone can tell 0.8 from 1), every run 0.8x
    with 3 % run-to-run noise: the study-level verdict is slower, its interval below 1 and around 0.8,
    the sign test agrees, and `--fail-on slower` exits 1 naming it in one line."""
    noisy = edited_copy(once, tmp_path / "a", lambda r: with_window(r, 0.2))
    slow = edited_copy(noisy, tmp_path / "b", lambda r: every_point_times(r, 0.8, noise=0.03))
    status, info, out, err = compare_study(noisy, slow, tmp_path, "--fail-on", "slower")
    study = info["study"]
    assert info["slower"] <= 2 and info["same"] >= 11  # point by point it mostly passes
    assert (
        study["verdict"] == points.SLOWER
        and study["ci_high"] < 1.0
        and study["ci_low"] < 0.8 < study["ci_high"]
    )
    assert study["points"] == 15 and study["slower_points"] == 15 and study["sign_p_value"] == 2 / 2**15
    assert out.splitlines()[2].startswith("Study-level verdict: slower: B / A 0.")
    assert status == compare_cli.EXIT_GATE and len(err.splitlines()) == 1
    assert err.startswith("compare: --fail-on slower: Study-level verdict: slower")
    assert compare_study(noisy, slow, tmp_path, "--fail-on", "faster", "untested")[0] == 0


def test_the_demo_against_itself_says_no_difference_and_passes_every_gate(once, tmp_path):
    status, info, out, err = compare_study(once, once, tmp_path, "--fail-on", *compare_cli.GATES[:-1])
    assert status == 0 and not err
    assert info["study"]["verdict"] == "no difference" and info["study"]["ratio"] == 1.0
    assert out.splitlines()[2].startswith("Study-level verdict: no difference: B / A 1.000")


def test_the_study_level_interval_is_a_t_interval_across_the_points_and_the_sign_test_is_exact(
    once, tmp_path
):
    """The pooled ratio: exp of the mean of the points' log-ratios, a Student-t interval with n - 1 df
    on their standard error; a point whose window was not filled stays out (its rate has one-off
    costs), as does one whose run config differs (allowed); the sign test counts the rest."""

    def unfilled_and_changed(runs):
        runs = every_point_times(runs, 0.9, noise=0.05, seed=11)
        runs["window_filled"] = ~runs["point"].eq("strong/w2_r0")
        runs["whole_run_images_per_s"] = runs["images_per_s"]
        runs.loc[runs["point"].eq("weak/w2_r0"), "config.lr"] = 0.123
        return runs

    other = edited_copy(once, tmp_path / "b", unfilled_and_changed)
    table = run_compare(once, other, "--allow-different")
    pooled_rows = table[table["pooled"]]
    assert set(table.loc[~table["pooled"], "point"]) == {"strong/w2", "weak/w2"}
    logs = [math.log(r) for r in pooled_rows["throughput_ratio"]]
    n, mean = len(logs), statistics.fmean(logs)
    half = stats.t_quantile(0.975, n - 1) * statistics.stdev(logs) / math.sqrt(n)
    study = pooled.verdict(table, 0.95)
    assert study["points"] == n == 13 and study["left_out"] == 2
    assert study["ratio"] == pytest.approx(math.exp(mean))
    assert (study["ci_low"], study["ci_high"]) == (
        pytest.approx(math.exp(mean - half)),
        pytest.approx(math.exp(mean + half)),
    )
    slower = sum(d < 0 for d in logs)
    tail = sum(math.comb(n, k) for k in range(min(slower, n - slower) + 1)) / 2**n
    assert study["slower_points"] == slower and study["sign_p_value"] == pytest.approx(min(1.0, 2 * tail))
    assert pooled.sign_test(0, 0) == 1.0 and pooled.sign_test(3, 3) == 1.0


def test_each_point_says_the_smallest_slowdown_it_could_have_detected(once, tmp_path):
    """A point judged on its windows: exp(-(t_0.975 + t_0.8) se) with its se and Welch df; a noisier
    window can only detect a larger slowdown; a point without an interval has none."""
    quiet_a = edited_copy(once, tmp_path / "a", lambda r: with_window(r, 0.02))
    noisy_b = edited_copy(once, tmp_path / "b", lambda r: with_window(r, 0.2))
    for study, cv in ((quiet_a, 0.02), (noisy_b, 0.2)):
        row = run_compare(study, study).set_index("point").loc["strong/w2"]
        variance = 2 * statistics.variance([math.log(1 + cv * f) for f in SPREAD])  # df 3 + 3
        expected = math.exp(
            -(stats.t_quantile(0.975, 6.0) + stats.t_quantile(0.8, 6.0)) * math.sqrt(variance)
        )
        assert row["detectable_ratio"] == pytest.approx(expected), cv
    assert spread.detectable_ratio(math.nan, 3.0, 0.95) != spread.detectable_ratio(math.nan, 3.0, 0.95)
    plain = run_compare(once, once)
    assert plain["detectable_ratio"].isna().all()  # one repeat, no window rates: no test


def test_compare_says_nothing_that_does_not_concern_the_comparison(once, tmp_path, capsys, caplog):
    """No analysis.comm_model.gpus_per_node assumption, no "window not filled" per point (the point's
    verdict says "not tested"): the comparison's own lines only; contended points are named in it."""

    def unfilled_and_contended(runs):
        runs = with_window(runs, 0.02)
        runs["window_filled"] = ~runs["stage"].eq("profile")
        runs["whole_run_images_per_s"] = runs["images_per_s"]
        runs["contended"] = runs["point"].eq("weak/w1_r0")
        runs["contention"] = runs["contended"].map({True: "pid 4242 (python) on GPU 0", False: ""})
        return runs

    study = edited_copy(once, tmp_path / "a", unfilled_and_contended)
    with caplog.at_level(logging.INFO):
        assert compare_cli.main([str(study), str(study)]) == 0
    captured = capsys.readouterr()
    assert not captured.err and not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert "Contended (a foreign process on the GPUs while measuring" in captured.out
    assert "scaling/weak/w1." in captured.out and "profile/w1 | 1/1 | 1.000 | not tested" in captured.out
    assert logging.getLogger(compare_cli.ANALYSIS_LOGGER).level == logging.NOTSET  # restored


def test_two_studies_of_one_name_are_told_apart_by_commit_or_folder(once, tmp_path):
    first = edited_copy(once, tmp_path / "x" / "demo", lambda r: r)
    second = edited_copy(once, tmp_path / "y" / "demo", lambda r: r)
    heading = compare_study(first, second, tmp_path)[2].splitlines()[0]
    assert heading == f"# demo [folder {second.parent}] (B) against demo [folder {first.parent}] (A)"

    def other_commit(runs):
        runs["provenance.git_commit"] = "5d6e7f8a9b0c1d2e3f40"
        return runs

    later = edited_copy(once, tmp_path / "z" / "demo", other_commit)
    commit = str(pd.read_csv(once / "tables/runs.csv")["provenance.git_commit"].iloc[0])[:7]
    heading = compare_study(first, later, tmp_path)[2].splitlines()[0]
    assert heading == f"# demo [commit 5d6e7f8] (B) against demo [commit {commit}] (A)"
    assert compare_study(first, first, tmp_path)[2].startswith("# demo (B) against demo (A)")


def test_the_gate_on_any_point_fails_where_one_point_is_slower(reference, tmp_path):
    """--fail-on any-slower: one point slower (its repeats say so) fails, though the study-level
    verdict over all points is not slower; --fail-on slower passes it."""
    slower = edited_copy(
        reference, tmp_path / "b", lambda r: scale_throughput(r, r["point"].str.startswith("weak/w1_r"), 0.8)
    )
    status, info, _, err = compare_study(reference, slower, tmp_path, "--fail-on", "any-slower")
    assert info["slower"] == 1 and info["study"]["verdict"] != points.SLOWER
    assert status == compare_cli.EXIT_GATE and "scaling/weak/w1" in err
    assert compare_study(reference, slower, tmp_path, "--fail-on", "slower")[0] == 0
