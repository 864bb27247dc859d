"""Contention (scalestudy.analysis.contention): a foreign process on a point's GPU while it measured
marks the point contended at every step, runs.csv -> tables -> acceptance -> figures -> paper ->
MLflow tags, and no criterion passes from it; one outside the window does not; the re-measure
command names exactly the contended points. A constructed study carries the known answer."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest

from scalestudy import atomic
from scalestudy.analysis import acceptance, aggregate, contention, metrics, monitor_window, settings
from scalestudy.analysis import constructed_study as synthetic
from scalestudy.paper import numbers
from scalestudy.plan import grid
from scalestudy.plan.runfiles import MONITOR_COLUMNS
from scalestudy.plots import scaling as scaling_plots
from scalestudy.plots import sensitivity as sensitivity_plots
from scalestudy.plots import style
from tests.contended_study import STRONG_2, STRONG_4, SWEEP_FASTEST, small_study
from tests.paper_study import CONTEXT

SETTINGS = settings.resolved({"acceptance": {"strong_efficiency_world": 2}})


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("contended")
    config = small_study()
    foreign = (
        synthetic.Foreign(STRONG_2, inside=True, pid=31337, mem_mb=3100.0),
        synthetic.Foreign(STRONG_4, inside=False, pid=4242),
        synthetic.Foreign(SWEEP_FASTEST, inside=True, pid=777, mem_mb=500.0),
    )
    folders = synthetic.make_study(root, config, synthetic.Truth(foreign=foreign))
    catalog = aggregate.build_catalog([folder / "summary.json" for folder in folders])
    runs = metrics.run_metrics(catalog, SETTINGS)
    scaling_table = metrics.scaling_table(runs, SETTINGS)
    sweep = metrics.sensitivity_table(runs)
    monitors = sorted(root.glob("results/runs/scaling/*/*/gpu_monitor.csv"))
    samples, reasons = monitor_window.load(monitors)
    table = acceptance.evaluate(
        scaling_table,
        sweep,
        SETTINGS["acceptance"],
        monitor_window.per_gpu(samples),
        SETTINGS["monitor"],
        reasons,
    )
    return {
        "root": root,
        "config": config,
        "catalog": catalog,
        "scaling": scaling_table,
        "sensitivity": sweep,
        "acceptance": table,
    }


def _summary(root, run_dir: str) -> dict:
    return json.loads((root / run_dir / "summary.json").read_text())["results"]


def test_the_run_with_a_foreign_process_in_its_window_is_contended_with_the_evidence(study):
    inside = _summary(study["root"], STRONG_2)
    assert inside["contended"] is True and inside["contention_checked"] is True
    evidence = re.fullmatch(
        r"GPU-00000000 on gpu001: 1 foreign process \(pids 31337; 3100 MB\) in (\d+) of (\d+) window samples",
        inside["contention"],
    )
    assert evidence, inside["contention"]
    seen, window = map(int, evidence.groups())
    assert 0 < seen < window == inside["monitor_window_samples"] >= 10
    before = _summary(study["root"], STRONG_4)  # a foreign process before the window: not counted
    assert before["contended"] is False and before["contention"] == "" and before["contention_checked"]
    monitor = pd.read_csv(study["root"] / STRONG_4 / "gpu_monitor.csv")
    assert (monitor["foreign_processes"] > 0).any()  # it was there, outside the window


def test_runs_csv_carries_the_mark_and_a_summary_without_it_is_judged_from_its_files(study, tmp_path):
    catalog = study["catalog"].set_index("run_dir")
    root = study["root"]
    assert bool(catalog.loc[str(root / STRONG_2), "contended"]) is True
    assert not catalog.drop(index=[str(root / STRONG_2), str(root / SWEEP_FASTEST)])["contended"].any()
    assert catalog.loc[str(root / STRONG_2), "provenance.git_commit"] == "0" * 40  # provenance intact
    # a summary written before the trainer judged contention: aggregate judges its monitor files
    older = tmp_path / "results/runs/scaling/strong/w2_r0"
    older.mkdir(parents=True)
    for name in ("gpu_monitor.csv", "gpu_monitor.json", "metrics.csv"):
        (older / name).write_bytes((root / STRONG_2 / name).read_bytes())
    summary = json.loads((root / STRONG_2 / "summary.json").read_text())
    for key in contention.RUN_KEYS:
        del summary["results"][key]
    atomic.write_json(older / "summary.json", summary)
    (row,) = aggregate.build_catalog([older / "summary.json"]).to_dict("records")
    assert {key: row[key] for key in contention.RUN_KEYS} == {
        key: _summary(root, STRONG_2)[key] for key in contention.RUN_KEYS
    }


def test_the_tables_count_and_name_the_contended_points(study):
    scaling = study["scaling"].set_index(["mode", "world_size"])
    point = scaling.loc[("strong", 2)]
    assert bool(point["contended"]) and point["repeats_contended"] == 1
    assert point["contention"].startswith("strong/w2_r0: GPU-00000000 on gpu001: 1 foreign process")
    assert "1 of 1 repeat(s): contended" in point["note"]
    others = scaling.drop(index=[("strong", 2)])
    assert not others["contended"].any() and (others["repeats_contended"] == 0).all()
    sweep = study["sensitivity"].set_index("precision")
    assert bool(sweep.loc["bf16", "contended"]) and not bool(sweep.loc["fp32", "contended"])
    # the contended point is the fastest, but the best one is an unshared point
    assert sweep.loc["bf16", "images_per_s_per_gpu"] > sweep.loc["fp32", "images_per_s_per_gpu"]
    assert bool(sweep.loc["fp32", "best"]) and not bool(sweep.loc["bf16", "best"])


def test_no_criterion_passes_from_a_contended_point(study):
    table = study["acceptance"].set_index("criterion")
    strong = table.loc["strong-scaling efficiency at 2 GPUs"]
    assert strong.status == "not measured (contended)"
    assert "pids 31337" in strong.note and "scalestudy.analysis.contention targets" in strong.note
    gain = table.loc["throughput gain per GPU of the best optimisation over the baseline"]
    assert "bf16" not in gain.note and "1 contended sweep point(s) not judged" in gain.note
    health = table[table.index.str.contains("least loaded GPU|busiest GPU")]
    assert health["note"].str.contains("no verdict from 2 GPU\\(s\\) contended").all()  # strong w2's two GPUs
    # with the 2-GPU point alone in the grid, nothing is left to judge: no verdict at all
    scaling = study["scaling"][study["scaling"]["world_size"] <= 2]
    only = acceptance.strong_efficiency(scaling[scaling["mode"] == "strong"], 0.9, 2)
    assert [row["status"] for row in only] == ["not measured (contended)"]


def test_a_contended_point_is_drawn_apart(study, monkeypatch):
    kept = []
    monkeypatch.setattr(style, "save_figure", lambda fig, png, pdf=None: kept.append(fig))
    scaling_plots.throughput(study["scaling"], "unused.png")
    lines = kept[0].axes[0].get_lines()
    crosses = [line for line in lines if line.get_marker() == "X" and len(line.get_xdata())]
    assert [list(line.get_xdata()) for line in crosses] == [[2]]
    assert crosses[0].get_color() == style.mode_style("strong")["color"]
    labels = kept[0].axes[0].get_legend_handles_labels()[1]
    assert scaling_plots.CONTENDED_LABEL in labels
    sensitivity_plots.heatmaps(
        study["sensitivity"], "unused.png", axes=grid.sensitivity_axes(study["config"])
    )
    patches = [patch for ax in kept[1].axes for patch in ax.patches]
    crossed = [p for p in patches if p.get_hatch() == sensitivity_plots.CONTENDED_STYLE["hatch"]]
    assert len(crossed) == 1
    legend = [text.get_text() for legend in kept[1].legends for text in legend.get_texts()]
    assert sensitivity_plots.CONTENDED_LABEL in legend


def test_the_paper_names_the_contended_points(study):
    tables = {"runs": study["catalog"], "scaling": study["scaling"], "acceptance": study["acceptance"]}
    built = numbers.build(tables, CONTEXT)
    total = len(study["catalog"])
    assert built.macros["ContendedRuns"].value == f"2 of {total}"
    points = built.macros["ContendedPoints"].value
    assert "scaling/strong/w2\\_r0 (GPU-00000000 on gpu001: 1 foreign process (pids 31337; 3100 MB)" in points
    assert "sensitivity/bf16/bs256\\_bucket25" in points and "w4\\_r0" not in points
    assert built.macros["ContentionChecked"].value == f"{total} of {total}"
    short = study["catalog"][study["catalog"]["monitor_window_samples"] < 10]
    assert set(short["stage"]) == {"profile"}  # a few profiled steps: a window of a few samples
    assert built.macros["MonitorWindowShort"].value == f"{len(short)} of {total}"


def test_re_measuring_names_exactly_the_contended_runs(study, tmp_path, capsys):
    runs_csv = tmp_path / "runs.csv"
    atomic.write_csv(runs_csv, study["catalog"])
    assert contention.main(["targets", "--runs", str(runs_csv)]) == 0
    printed = capsys.readouterr().out.split()
    assert printed == sorted(
        f"{study['root'] / run_dir}/summary.json" for run_dir in (STRONG_2, SWEEP_FASTEST)
    )
    atomic.write_csv(runs_csv, study["catalog"].assign(contended=False))
    assert contention.main(["targets", "--runs", str(runs_csv)]) == 0
    assert capsys.readouterr().out == ""
    with pytest.raises(ValueError, match="missing column"):
        contention.main(["targets", "--runs", str(_without_run_dir(study["catalog"], tmp_path))])
    with pytest.raises(SystemExit, match="nowhere.csv: no such file"):
        contention.main(["targets", "--runs", str(tmp_path / "nowhere.csv")])


def _without_run_dir(catalog: pd.DataFrame, folder):
    path = folder / "bare.csv"
    atomic.write_csv(path, catalog.drop(columns=["run_dir"]))
    return path


# --- the judge's cases ------------------------------------------------------------------------------


def _samples(foreign, processes=None, mem=None, times=range(10), load=2.0, host_cpus=64):
    rows = []
    for t in times:
        n = foreign(t)
        listed = processes(t) if processes else 1 + n
        rows.append(
            dict.fromkeys(MONITOR_COLUMNS)
            | {
                "time_s": float(t),
                "host": "gpu01",
                "gpu_index": 0,
                "gpu_uuid": "GPU-a",
                "rank": 0,
                "processes": listed,
                "foreign_processes": n,
                "foreign_mem_mb": mem(t) if mem else 1000.0 * n,
                "host_load_1m": load,
                "host_cpus": host_cpus,
            }
        )
    return pd.DataFrame(rows, columns=list(MONITOR_COLUMNS))


def _info(spans, namespace=0, cpus=16):
    gpu = {
        "uuid": "GPU-a",
        "processes": {"expected_own": 1, "pid_namespace_samples": namespace, "foreign": spans},
    }
    return {"nodes": [{"host": "gpu01", "gpus": [gpu], "cpus": list(range(cpus))}]}


def test_only_the_window_counts_and_pids_are_those_seen_in_it():
    samples = _samples(lambda t: int(t in (1, 6, 7)))
    spans = [
        {"pid": 11, "first_s": 1.0, "last_s": 1.0, "identified": True},
        {"pid": 22, "first_s": 6.0, "last_s": 7.0, "identified": True},
    ]
    verdict = contention.judge(samples, _info(spans), [(4.0, 8.0)])
    assert verdict["contended"] and verdict["monitor_window_samples"] == 5
    assert (
        verdict["contention"]
        == "GPU-a on gpu01: 1 foreign process (pids 22; 1000 MB) in 2 of 5 window samples"
    )
    quiet = contention.judge(samples, _info(spans), [(2.0, 5.0)])
    assert not quiet["contended"] and quiet["contention"] == "" and quiet["monitor_window_samples"] == 4
    whole = contention.judge(samples, _info(spans), None)  # no window recorded: the whole run
    assert "pids 11, 22" in whole["contention"] and whole["monitor_window_samples"] == 10
    earlier = contention.judge(samples, _info(spans), [])  # an earlier attempt's window: no sample
    assert (earlier["contended"], earlier["monitor_window_samples"], earlier["contention_checked"]) == (
        False,
        0,
        False,
    )


def test_in_a_pid_namespace_the_evidence_says_the_pids_are_not_comparable():
    samples = _samples(lambda t: 1, processes=lambda t: 2, mem=lambda t: float("nan"))
    spans = [{"pid": p, "first_s": 0.0, "last_s": 9.0, "identified": False} for p in (501, 502)]
    verdict = contention.judge(samples, _info(spans, namespace=10), None)
    assert verdict["contended"]
    assert verdict["contention"] == (
        "GPU-a on gpu01: 1 process beyond the job's 1 (PIDs not comparable, a PID namespace: NVML listed "
        "pids 501, 502) in 10 of 10 window samples"
    )


def test_without_a_process_list_nothing_is_claimed_and_nothing_is_checked():
    samples = _samples(lambda t: 0).assign(processes=None, foreign_processes=None, foreign_mem_mb=None)
    verdict = contention.judge(samples, _info([]), None)
    assert verdict["contended"] is False and verdict["contention_checked"] is False
    assert verdict["monitor_window_samples"] == 10  # the window's samples still count
    blind = contention.judge(_samples(lambda t: 0, processes=lambda t: 0), _info([]), None)
    assert blind["contention_checked"] is False  # not even the job's own process listed: a hidden view
    cpu = contention.judge(pd.DataFrame(columns=list(MONITOR_COLUMNS)), {}, None)
    assert cpu == contention.not_judged() and cpu["monitor_window_samples"] is None


def test_host_load_above_the_jobs_cpus_is_a_warning_not_a_verdict():
    samples = _samples(lambda t: 0, load=23.4)
    verdict = contention.judge(samples, _info([], cpus=16), None)
    assert not verdict["contended"]
    assert (
        verdict["host_load_warning"]
        == "gpu01: 1-minute load 23.4 (mean in the window) above the job's 16 CPUs (the host has 64)"
    )
    assert (
        contention.judge(_samples(lambda t: 0, load=12.0), _info([], cpus=16), None)["host_load_warning"]
        == ""
    )


def test_a_short_window_is_marked_in_the_tables():
    rows = [
        synthetic.run_row("scaling", 1, 256, 0.1, mode="weak", monitor_window_samples=4),
        synthetic.run_row("scaling", 2, 256, 0.1, mode="weak", monitor_window_samples=40),
        synthetic.run_row("scaling", 2, 256, 0.1, mode="weak", repeat=1),  # a CPU run: no samples
    ]
    runs = metrics.run_metrics(pd.DataFrame(rows), settings.resolved({}))
    assert runs["monitor_window_short"].tolist() == [True, False, False]
    table = metrics.scaling_table(runs, settings.resolved({})).set_index("world_size")
    assert bool(table.loc[1, "monitor_window_short"]) and table.loc[1, "monitor_windows_short"] == 1
    assert "fewer GPU monitor samples in the window" in table.loc[1, "note"]
    assert not bool(table.loc[2, "monitor_window_short"]) and table.loc[2, "monitor_window_samples"] == 40
    loose = metrics.run_metrics(pd.DataFrame(rows), settings.resolved({"monitor": {"min_window_samples": 3}}))
    assert not loose["monitor_window_short"].any()
