"""Every figure renders a non-empty PNG and PDF from constructed data; the no-GPU monitor case says so."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from scalestudy.analysis import aggregate, commmodel, metrics, monitor_window, settings
from scalestudy.analysis import constructed_study as synthetic
from scalestudy.plan import studyconfig
from scalestudy.plots import comm_model as model
from scalestudy.plots import curves, energy, monitor, scaling, sensitivity, style
from scalestudy.plots.__main__ import main as plots_main

SETTINGS = settings.resolved({})
DEMO = Path(__file__).resolve().parents[1] / "config/demo.yaml"


def build(root: Path, gpu: bool) -> dict:
    config = studyconfig.load(DEMO)
    config["scaling"]["world_sizes"] = [1, 2, 4]
    config["scaling"]["repeats"] = 2
    folders = synthetic.make_study(root, config, synthetic.Truth(gpu=gpu, noise=0.02))
    runs = metrics.run_metrics(aggregate.build_catalog([f / "summary.json" for f in folders]), SETTINGS)
    _, _, prediction = commmodel.analyse(runs, SETTINGS)
    scaling_runs = sorted(root.glob("results/runs/scaling/*/*"))
    return {
        "scaling": metrics.scaling_table(runs, SETTINGS),
        "sensitivity": metrics.sensitivity_table(runs),
        "prediction": prediction,
        "metrics": [d / "metrics.csv" for d in scaling_runs],
        "monitor": [d / "gpu_monitor.csv" for d in scaling_runs],
    }


@pytest.fixture(scope="module")
def gpu_study(tmp_path_factory):
    return build(tmp_path_factory.mktemp("gpu"), gpu=True)


@pytest.fixture(scope="module")
def cpu_study(tmp_path_factory):
    return build(tmp_path_factory.mktemp("cpu"), gpu=False)


def assert_figure(png: Path, pdf: Path) -> None:
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5_000
    assert pdf.read_bytes()[:5] == b"%PDF-" and pdf.stat().st_size > 2_000


DRAW = {
    "throughput": lambda s, png, pdf: scaling.throughput(s["scaling"], png, pdf),
    "efficiency": lambda s, png, pdf: scaling.efficiency(s["scaling"], png, pdf, SETTINGS["acceptance"]),
    "epoch_time": lambda s, png, pdf: scaling.epoch_time(s["scaling"], png, pdf),
    "sensitivity": lambda s, png, pdf: sensitivity.heatmaps(s["sensitivity"], png, pdf),
    "accuracy": lambda s, png, pdf: curves.accuracy(curves.load_curves(s["metrics"]), png, pdf, 0.3),
    "monitor": lambda s, png, pdf: monitor.timelines(
        *monitor_window.load(s["monitor"])[:1], png, pdf, SETTINGS["monitor"]
    ),
    "comm_model": lambda s, png, pdf: model.model_vs_measurement(s["prediction"], s["scaling"], png, pdf),
    "energy": lambda s, png, pdf: energy.figure(s["scaling"], png, pdf),
}


@pytest.mark.parametrize("name", sorted(DRAW))
def test_figure_renders_png_and_pdf(gpu_study, tmp_path, name):
    png, pdf = style.png_and_pdf(tmp_path / name)
    DRAW[name](gpu_study, png, pdf)
    assert_figure(png, pdf)


def test_monitor_without_gpu_says_why(cpu_study, tmp_path):
    samples, reasons = monitor_window.load(cpu_study["monitor"])
    assert samples.empty
    assert reasons == ["no NVIDIA GPU (device cpu)"]
    png, pdf = style.png_and_pdf(tmp_path / "monitor")
    monitor.timelines(samples, png, pdf, SETTINGS["monitor"], reasons)
    assert_figure(png, pdf)


def placeholder_texts(monkeypatch) -> list[str]:
    """What style.placeholder_note is asked to say while a figure draws."""
    said = []
    original = style.placeholder_note
    monkeypatch.setattr(
        style, "placeholder_note", lambda ax, text, **kw: (said.append(text), original(ax, text, **kw))
    )
    return said


def test_energy_figure_draws_measured_energy_and_rings_the_cheapest_scales(gpu_study, tmp_path, monkeypatch):
    said = placeholder_texts(monkeypatch)
    table = gpu_study["scaling"]
    assert (table["energy_source"] == "counter").all() and (table["energy_to_target_j_mean"] > 0).all()
    png, pdf = style.png_and_pdf(tmp_path / "energy")
    energy.figure(table, png, pdf)
    assert_figure(png, pdf)
    assert said == []
    assert energy.unit_of(pd.Series([7200.0, 90.0]), energy.TIME_UNITS) == (3600.0, "h")


def test_the_energy_hours_panel_is_titled_in_the_unit_its_axis_is_in(gpu_study, tmp_path, monkeypatch):
    """Panel (c) once read 'rank-hours' above an axis in rank-seconds (issue 43)."""
    drawn = []
    monkeypatch.setattr(style, "save_figure", lambda fig, png, pdf=None: drawn.append(fig))
    table = gpu_study["scaling"]
    for scale, shown in ((1.0, "seconds"), (3600.0, "hours")):  # GPU-hours of a few seconds, then hours
        hours = table["gpu_hours_to_target_mean"] / table["gpu_hours_to_target_mean"].max() * scale / 3600
        energy.figure(table.assign(gpu_hours_to_target_mean=hours * 2), tmp_path / "e.png")
        panel = drawn[-1].axes[2]
        assert panel.get_ylabel() == f"GPU-{shown} to target"
        assert panel.get_title() == f"(c) GPU-{shown} to target"


def test_energy_figure_without_energy_says_not_measured_and_why(cpu_study, tmp_path, monkeypatch):
    said = placeholder_texts(monkeypatch)
    png, pdf = style.png_and_pdf(tmp_path / "energy_cpu")
    energy.figure(cpu_study["scaling"], png, pdf)
    assert_figure(png, pdf)
    assert len(said) == 2 and all(
        text.startswith("Energy not measured: no NVIDIA GPU (device cpu)") for text in said
    )
    assert "RAPL" in said[0]


def test_monitor_selects_strong_repeat_zero():
    paths = [
        f"results/runs/scaling/{m}/w{n}_r{r}/gpu_monitor.csv"
        for m in ("strong", "weak")
        for n in (1, 2)
        for r in (0, 1)
    ]
    assert monitor.select(paths) == [p for p in paths if "/strong/" in p and "_r0/" in p]
    assert monitor.short_label("scaling/strong/w8_r0") == "strong, 8 GPUs"


def test_monitor_names_a_file_missing_columns(tmp_path):
    path = tmp_path / "gpu_monitor.csv"
    path.write_text("time_s,host\n0,a\n")
    with pytest.raises(ValueError, match=rf"{path}: missing column\(s\) gpu_index"):
        monitor_window.load([path])


def test_accuracy_rejects_a_path_that_is_not_a_scaling_run(tmp_path):
    with pytest.raises(ValueError, match="not a scaling run's file"):
        curves.load_curves([tmp_path / "metrics.csv"])


def test_sensitivity_with_a_missing_cell(gpu_study, tmp_path):
    partial = gpu_study["sensitivity"].iloc[1:]
    png, pdf = style.png_and_pdf(tmp_path / "partial")
    sensitivity.heatmaps(partial, png, pdf)
    assert_figure(png, pdf)


def test_cli_draws_a_figure(gpu_study, tmp_path):
    table = tmp_path / "scaling.csv"
    gpu_study["scaling"].to_csv(table, index=False)
    png, pdf = style.png_and_pdf(tmp_path / "cli_efficiency")
    assert plots_main(["efficiency", "--scaling", str(table), "--png", str(png), "--pdf", str(pdf)]) == 0
    assert_figure(png, pdf)


def test_cli_names_missing_columns(tmp_path):
    table = tmp_path / "scaling.csv"
    pd.DataFrame({"mode": ["strong"]}).to_csv(table, index=False)
    with pytest.raises(ValueError, match=rf"{table}: missing column\(s\) world_size"):
        plots_main(["throughput", "--scaling", str(table), "--png", str(tmp_path / "x.png")])


def test_style_contract_used_by_other_figure_modules(tmp_path):
    """new_figure / save_figure / placeholder_note: the profiling figures rely on these."""
    fig, axes = style.new_figure(wide=True, ncols=2)
    assert axes.shape == (1, 2)
    assert fig.get_size_inches()[0] == pytest.approx(style.TEXT_WIDTH_IN)
    style.placeholder_note(axes[0, 0], "nothing to draw")
    axes[0, 1].plot([1, 2], [3, 4])
    png, pdf = style.png_and_pdf(tmp_path / "contract")
    style.save_figure(fig, png, pdf)
    assert_figure(png, pdf)
    style.save_figure(style.new_figure()[0], tmp_path / "only.png")  # the PDF is optional
    assert (tmp_path / "only.png").exists() and not (tmp_path / "only.pdf").exists()


@pytest.mark.parametrize(
    ("unit", "axis", "legend"),
    [("GPU", "GPUs (world size)", "2 GPUs"), ("rank", "ranks (world size)", "2 ranks")],
)
def test_labels_name_what_a_rank_drives(gpu_study, tmp_path, monkeypatch, unit, axis, legend):
    """A CPU study (the demo) is labelled in ranks, not GPUs; the unit is set by --unit."""
    drawn = []
    monkeypatch.setattr(style, "save_figure", lambda fig, png, pdf: drawn.append(fig))
    monkeypatch.setattr(style, "UNIT", {"word": "GPU"})
    table = tmp_path / "scaling.csv"
    gpu_study["scaling"].to_csv(table, index=False)
    assert (
        plots_main(["throughput", "--unit", unit, "--scaling", str(table), "--png", str(tmp_path / "t.png")])
        == 0
    )
    curves.accuracy(curves.load_curves(gpu_study["metrics"]), tmp_path / "a.png", None, 0.5)
    throughput, accuracy = (fig.axes[0] for fig in drawn)
    assert throughput.get_xlabel() == axis
    assert legend in [text.get_text() for text in accuracy.get_legend().get_texts()]


def _captured_figure(monkeypatch, draw):
    """The figure `draw` makes, kept open instead of saved."""
    kept = []
    monkeypatch.setattr(style, "save_figure", lambda fig, png, pdf=None: kept.append(fig))
    draw()
    return kept[0]


def _legend_labels(fig) -> list[str]:
    labels = [text.get_text() for legend in fig.legends for text in legend.get_texts()]
    for ax in fig.axes:
        if ax.get_legend() is not None:
            labels += [text.get_text() for text in ax.get_legend().get_texts()]
    return labels


def test_a_point_without_a_filled_window_is_drawn_hollow(gpu_study, monkeypatch):
    table = gpu_study["scaling"].copy()
    table["window_filled"] = True
    weak_2 = (table["mode"] == "weak") & (table["world_size"] == 2)
    fig = _captured_figure(monkeypatch, lambda: scaling.throughput(table, "unused.png"))
    assert scaling.UNFILLED_LABEL not in _legend_labels(fig)
    table.loc[weak_2, "window_filled"] = False
    for draw in (scaling.throughput, scaling.efficiency):
        fig = _captured_figure(monkeypatch, lambda draw=draw: draw(table, "unused.png"))
        assert scaling.UNFILLED_LABEL in _legend_labels(fig)
        hollow = [
            line
            for line in fig.axes[0].get_lines()
            if line.get_markerfacecolor() == "white" and len(line.get_xdata())
        ]
        assert len(hollow) == 1 and list(hollow[0].get_xdata()) == [2]
        assert hollow[0].get_markeredgecolor() == style.mode_style("weak")["color"]


def test_a_sensitivity_cell_without_a_filled_window_is_hatched(gpu_study, monkeypatch):
    table = gpu_study["sensitivity"].copy()
    table["window_filled"] = [False] + [True] * (len(table) - 1)
    fig = _captured_figure(monkeypatch, lambda: sensitivity.heatmaps(table, "unused.png"))
    hatched = [patch for ax in fig.axes for patch in ax.patches if patch.get_hatch()]
    assert len(hatched) == 1 and sensitivity.UNFILLED_LABEL in _legend_labels(fig)
