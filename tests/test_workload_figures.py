"""The figures of any workload: the workload's unit in every label, DDP and FSDP as separate
series, memory per rank, the LM's loss curves, the sensitivity heatmaps over generic axes and the
plots command line. Known answers on the small constructed tables of test_workload_analysis.py."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from scalestudy.analysis import metrics
from scalestudy.analysis.constructed_study import run_row
from scalestudy.plots import curves, memory, monitor, scaling, sensitivity, style
from scalestudy.plots.__main__ import main as plots_main
from tests.workload_runs import MIB, SETTINGS, T1, scaling_of, series_runs, sweep_rows


@pytest.fixture(autouse=True)
def gpu_labels(monkeypatch):
    """Every test starts from the default unit (plots set it once per process) and closes the
    figures it kept open."""
    import matplotlib.pyplot as plt

    monkeypatch.setattr(style, "UNIT", {"word": "GPU"})
    yield
    plt.close("all")


def kept_figures(monkeypatch) -> list:
    """The figures the plotting functions make, kept open instead of saved."""
    kept = []
    monkeypatch.setattr(style, "save_figure", lambda fig, png, pdf=None: kept.append(fig))
    return kept


@pytest.mark.parametrize(
    ("unit", "word", "throughput_label", "colour_label"),
    [
        ("images", "GPU", "Throughput (images/s, all GPUs)", "Images/s per GPU (2 GPUs)"),
        ("tokens", "rank", "Throughput (tokens/s, all ranks)", "Tokens/s per rank (2 ranks)"),
    ],
)
def test_labels_carry_the_workloads_unit(monkeypatch, unit, word, throughput_label, colour_label):
    kept = kept_figures(monkeypatch)
    style.set_unit(word)
    rows = [{**r, "sample_unit": unit} for r in series_runs("ddp", 0.8, MIB)]
    scaling.throughput(scaling_of(rows), "unused.png")
    runs = metrics.run_metrics(pd.DataFrame([{**r, "sample_unit": unit} for r in sweep_rows()]), SETTINGS)
    sensitivity.heatmaps(metrics.sensitivity_table(runs), "unused.png")
    assert kept[0].axes[0].get_ylabel() == throughput_label
    colourbar = kept[1].axes[-1]
    assert colourbar.get_ylabel() == colour_label
    assert kept[1].axes[0].get_ylabel() == f"Per-{word} batch"


def _legend(ax) -> list[str]:
    return [text.get_text() for text in ax.get_legend().get_texts()]


def test_ddp_and_fsdp_are_separate_series(monkeypatch):
    kept = kept_figures(monkeypatch)
    both = scaling_of(series_runs("ddp", 0.8, MIB) + series_runs("fsdp", 0.5, MIB))
    scaling.efficiency(both, "unused.png")
    scaling.throughput(scaling_of(series_runs("ddp", 0.8, MIB)), "unused.png")
    efficiency, ddp_only = (fig.axes[0] for fig in kept)
    assert {"strong scaling, DDP", "strong scaling, FSDP"} <= set(_legend(efficiency))
    lines = {bars.get_label(): bars.lines[0] for bars in efficiency.containers}  # errorbar's data lines
    fsdp = lines["strong scaling, FSDP"]
    assert list(fsdp.get_ydata()) == pytest.approx([1.0, 0.5, 0.5]) and fsdp.get_marker() == "D"
    assert fsdp.get_color() == lines["strong scaling, DDP"].get_color() == style.mode_style("strong")["color"]
    assert set(_legend(ddp_only)) == {"strong scaling", "ideal, strong"}  # a DDP study reads as before


def test_the_memory_figure_draws_both_quantities_per_series(monkeypatch):
    kept = kept_figures(monkeypatch)
    style.set_unit("rank")
    table = scaling_of(series_runs("ddp", 0.8, 40 * MIB) + series_runs("fsdp", 0.5, 40 * MIB))
    memory.memory(table, "unused.png")
    peak, state = kept[0].axes
    assert peak.get_ylabel() == "Peak memory per rank (MiB)" and "peak RSS (CPU)" in peak.get_title()
    assert state.get_ylabel() == "Model state per rank (MiB)" and state.get_xscale() == "log"
    drawn = {line.get_label(): list(line.get_ydata()) for line in state.get_lines()}
    assert drawn["strong scaling, FSDP"] == pytest.approx([40, 20, 10])
    assert drawn["strong scaling, DDP"] == pytest.approx([40, 40, 40])


def test_the_memory_figure_says_when_nothing_was_recorded(monkeypatch, tmp_path):
    kept = kept_figures(monkeypatch)
    memory.memory(scaling_of([run_row("scaling", 1, 64, T1, mode="strong")]), "unused.png")
    notes = [text.get_text() for ax in kept[0].axes for text in ax.texts]
    assert any("peak_memory_bytes not recorded" in note for note in notes)


def write_lm_metrics(root, parallelism: str = "fsdp") -> list:
    """metrics.csv of an LM's scaling runs whose losses fall epoch by epoch."""
    paths = []
    for world in (1, 2):
        folder = root / "scaling" / "strong" / f"{parallelism}-w{world}_r0"
        folder.mkdir(parents=True)
        epochs = np.arange(1, 4)
        frame = pd.DataFrame(
            {
                "epoch": epochs,
                "train_loss": 4.0 - epochs * 0.5,
                "test_loss": 4.2 - epochs * 0.5,
                "test_acc": 0.1,
            }
        )
        frame.to_csv(folder / "metrics.csv", index=False)
        paths.append(folder / "metrics.csv")
    return paths


def test_the_lm_quality_curve_is_the_falling_loss_with_perplexity(monkeypatch, tmp_path):
    kept = kept_figures(monkeypatch)
    loaded = curves.load_curves(write_lm_metrics(tmp_path))
    assert set(loaded["parallelism"]) == {"fsdp"} and sorted(loaded["world"].unique()) == [1, 2]
    curves.quality(loaded, "unused.png", metric="perplexity")
    ax = kept[0].axes[0]
    assert ax.get_ylabel() == "Loss (nats per token)"
    test_loss = next(line for line in ax.get_lines() if line.get_label() == "1 GPU, test")
    assert list(test_loss.get_ydata()) == pytest.approx([3.7, 3.2, 2.7])
    train_loss = next(line for line in ax.get_lines() if line.get_label() == "1 GPU, train")
    assert train_loss.get_linestyle() == "--"
    secondary = [child for child in ax.get_children() if child.__class__.__name__ == "SecondaryAxis"]
    assert len(secondary) == 1 and secondary[0].get_ylabel() == "Perplexity (exp loss)"


def test_the_accuracy_metric_draws_accuracy_and_a_bad_metric_is_named(monkeypatch, tmp_path):
    kept = kept_figures(monkeypatch)
    loaded = curves.load_curves(write_lm_metrics(tmp_path, "ddp"))
    curves.quality(loaded, "unused.png", metric="accuracy", target=0.5)
    assert kept[0].axes[0].get_ylabel() == "Test accuracy"
    with pytest.raises(ValueError, match="--metric 'bleu'"):
        curves.quality(loaded, "unused.png", metric="bleu")


def test_an_fsdp_run_is_named_in_the_monitor_legend():
    assert monitor.short_label("scaling/strong/fsdp-w8_r1") == "strong FSDP, 8 GPUs (r1)"
    assert monitor.short_label("scaling/weak/w2_r0") == "weak, 2 GPUs"


def three_axis_sweep() -> pd.DataFrame:
    runs = metrics.run_metrics(pd.DataFrame(sweep_rows()), SETTINGS)
    return metrics.sensitivity_table(runs)


def _panels(fig) -> list:
    return [ax for ax in fig.axes if ax.get_visible() and ax.images]


def test_the_default_heatmap_is_batch_by_bucket_one_panel_per_precision(monkeypatch):
    kept = kept_figures(monkeypatch)
    sensitivity.heatmaps(three_axis_sweep(), "unused.png")
    panels = _panels(kept[0])
    assert [ax.get_title() for ax in panels] == ["fp32", "bf16"]
    assert panels[0].get_xlabel() == "DDP bucket size (MB)"
    assert [t.get_text() for t in panels[0].get_xticklabels()] == ["1", "25"]
    assert [t.get_text() for t in panels[0].get_yticklabels()] == ["16", "32"]
    assert panels[1].images[0].get_array()[1, 1] == pytest.approx(100 * 1.5 * 2 * 1.25)  # bf16, 32, 25 MB


def test_the_heatmap_facets_the_axes_it_does_not_draw(monkeypatch):
    kept = kept_figures(monkeypatch)
    sensitivity.heatmaps(three_axis_sweep(), "unused.png", rows="precision", cols="bucket_cap_mb")
    panels = _panels(kept[0])
    assert [ax.get_title() for ax in panels] == ["per_gpu_batch=16", "per_gpu_batch=32"]
    assert panels[0].get_ylabel() == "Precision" and panels[1].get_ylabel() == ""
    assert [t.get_text() for t in panels[0].get_yticklabels()] == ["fp32", "bf16"]
    outlined = [
        p for ax in panels for p in ax.patches if p.get_edgecolor()[:3] != (0, 0, 0) and not p.get_fill()
    ]
    assert len(outlined) == 1 and outlined[0].axes is panels[1]  # the best point: batch 32


def test_four_axes_give_a_panel_per_combination_of_the_other_two(monkeypatch):
    kept = kept_figures(monkeypatch)
    runs = metrics.run_metrics(pd.DataFrame(sweep_rows(hooks=("none", "fp16_compress"))), SETTINGS)
    axes = ["comm_hook", "precision", "per_gpu_batch", "bucket_cap_mb"]
    sensitivity.heatmaps(metrics.sensitivity_table(runs, axes), "unused.png", axes=axes)
    titles = [ax.get_title() for ax in _panels(kept[0])]
    assert titles == [
        "comm_hook=fp16_compress\nfp32",
        "comm_hook=fp16_compress\nbf16",
        "comm_hook=none\nfp32",
        "comm_hook=none\nbf16",
    ]


@pytest.mark.parametrize(
    ("rows", "cols", "message"),
    [("lr", None, "--rows 'lr': not an axis"), ("precision", "precision", "both 'precision'")],
)
def test_a_bad_heatmap_axis_is_named(rows, cols, message):
    with pytest.raises(ValueError, match=message):
        sensitivity.choose_axes(metrics.DEFAULT_AXES, rows, cols)


def test_the_cli_draws_memory_sensitivity_and_the_loss(tmp_path):
    table = tmp_path / "scaling.csv"
    scaling_of(series_runs("ddp", 0.8, MIB) + series_runs("fsdp", 0.5, MIB)).to_csv(table, index=False)
    sweep = tmp_path / "sensitivity.csv"
    three_axis_sweep().to_csv(sweep, index=False)
    calls = {
        "memory": ["--scaling", str(table)],
        "sensitivity": ["--sensitivity", str(sweep), "--axes", *metrics.DEFAULT_AXES, "--rows", "precision"],
        "accuracy": ["--metrics", *map(str, write_lm_metrics(tmp_path)), "--metric", "perplexity"],
    }
    for figure, args in calls.items():
        png, pdf = style.png_and_pdf(tmp_path / figure)
        assert plots_main([figure, *args, "--unit", "rank", "--png", str(png), "--pdf", str(pdf)]) == 0
        assert png.stat().st_size > 5_000 and pdf.read_bytes()[:5] == b"%PDF-"
