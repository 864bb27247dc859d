"""The analysis, figures and paper of any workload: per-(mode, parallelism) series, memory per rank,
the workload's unit in every label, the LM's loss curves and the sensitivity sweep's generic axes.
Known answers on small constructed tables; the ResNet/DDP tables stay as they were."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from scalestudy.analysis import aggregate, energy, metrics, settings
from scalestudy.analysis.constructed_study import run_row
from scalestudy.paper import numbers, tables
from scalestudy.plots import curves, memory, monitor, scaling, sensitivity, style
from scalestudy.plots.__main__ import main as plots_main

SETTINGS = settings.resolved({})
MIB = 1 << 20
T1 = 0.2  # seconds per step on one rank


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


# ----------------------------------------------------------------------------- the run catalog
def summary(tmp_path, name: str, **results) -> str:
    record = {
        "run": {"stage": "scaling", "point": "strong/w1_r0", "mode": "strong"},
        "results": {**dict.fromkeys(aggregate.REQUIRED_RESULTS, 1), **results},
        "provenance": {},
    }
    path = tmp_path / name / "summary.json"
    path.parent.mkdir()
    path.write_text(json.dumps(record))
    return str(path)


def test_an_old_summary_reads_as_the_resnet_ddp_study(tmp_path):
    row = aggregate.summary_row(summary(tmp_path, "old"))
    assert (row["workload"], row["sample_unit"], row["parallelism"]) == ("resnet18-cifar10", "images", "ddp")
    for column in aggregate.MEMORY_AND_QUALITY:
        assert row[column] is None, column


def test_the_lm_summary_keys_reach_the_catalog(tmp_path):
    lm = {
        "workload": "gpt",
        "sample_unit": "tokens",
        "parallelism": "fsdp",
        "peak_memory_bytes": 3 * MIB,
        "peak_memory_bytes_per_rank": [2 * MIB, 3 * MIB],
        "model_state_bytes_per_rank": MIB,
        "final_test_loss": 2.0,
        "final_test_perplexity": math.exp(2.0),
    }
    out = tmp_path / "runs.csv"
    aggregate.main(
        ["--summaries", summary(tmp_path, "lm", **lm), summary(tmp_path, "old"), "--out", str(out)]
    )
    catalog = pd.read_csv(out)
    lm_row, old_row = catalog.iloc[0], catalog.iloc[1]
    assert (lm_row["workload"], lm_row["sample_unit"], lm_row["parallelism"]) == ("gpt", "tokens", "fsdp")
    assert lm_row["peak_memory_bytes"] == 3 * MIB and lm_row["model_state_bytes_per_rank"] == MIB
    assert json.loads(lm_row["peak_memory_bytes_per_rank"]) == [2 * MIB, 3 * MIB]
    assert lm_row["final_test_perplexity"] == pytest.approx(math.exp(2.0))
    assert old_row["workload"] == "resnet18-cifar10" and pd.isna(old_row["peak_memory_bytes"])


def test_a_command_workload_counts_in_its_configured_unit(tmp_path):
    path = summary(tmp_path, "cmd")
    record = json.loads(Path(path).read_text())
    record["run"].update(workload="command", command={"sample_unit": "sequences"})
    Path(path).write_text(json.dumps(record))
    row = aggregate.summary_row(path)
    assert (row["workload"], row["sample_unit"]) == ("command", "sequences")


# ----------------------------------------------------------------------------- two series
def series_runs(parallelism: str, efficiency: float, state_bytes: float, repeats: int = 1) -> list[dict]:
    """Strong scaling at a known efficiency, with memory that FSDP shards and DDP replicates."""
    rows = []
    for n in (1, 2, 4):
        step = T1 if n == 1 else T1 / (efficiency * n)
        for r in range(repeats):
            row = run_row("scaling", n, 64 // n, step, mode="strong", repeat=r)
            sharded = state_bytes / n if parallelism == "fsdp" else state_bytes
            row.update(
                parallelism=parallelism,
                point=f"strong/{'' if parallelism == 'ddp' else 'fsdp-'}w{n}_r{r}",
                peak_memory_bytes=(100 + r) * MIB,  # median over repeats: the middle one
                model_state_bytes_per_rank=sharded,
                peak_memory_source="cpu_peak_rss",
                sample_unit="tokens",
            )
            rows.append(row)
    return rows


def scaling_of(rows) -> pd.DataFrame:
    return metrics.scaling_table(metrics.run_metrics(pd.DataFrame(rows), SETTINGS), SETTINGS)


def test_each_series_is_referenced_to_its_own_one_rank_runs():
    table = scaling_of(series_runs("ddp", 0.8, 40 * MIB) + series_runs("fsdp", 0.5, 40 * MIB, repeats=3))
    assert list(zip(table["parallelism"], table["world_size"], strict=True)) == [
        ("ddp", 1),
        ("ddp", 2),
        ("ddp", 4),
        ("fsdp", 1),
        ("fsdp", 2),
        ("fsdp", 4),
    ]
    by = table.set_index(["parallelism", "world_size"])
    assert by.loc[("ddp", 4), "efficiency_mean"] == pytest.approx(0.8)
    assert by.loc[("fsdp", 4), "efficiency_mean"] == pytest.approx(0.5)
    assert by.loc[("fsdp", 4), "speedup_mean"] == pytest.approx(2.0)
    assert by.loc[("fsdp", 4), "repeats"] == 3
    assert by.loc[("ddp", 4), "model_state_bytes_per_rank"] == 40 * MIB
    assert by.loc[("fsdp", 4), "model_state_bytes_per_rank"] == 10 * MIB
    assert by.loc[("fsdp", 2), "peak_memory_bytes"] == 101 * MIB  # median of 100, 101, 102 MiB
    assert set(table["sample_unit"]) == {"tokens"} and set(table["peak_memory_source"]) == {"cpu_peak_rss"}


def test_a_ddp_only_table_keeps_todays_columns_first_and_its_values():
    rows = [run_row("scaling", n, 64, T1 / (0.9 if n > 1 else 1), mode="weak") for n in (1, 2)]
    table = scaling_of(rows)
    appended = ["parallelism", "sample_unit", "peak_memory_bytes", "model_state_bytes_per_rank"]
    memory_end = list(table.columns).index("peak_memory_source") + 1
    assert list(table.columns[memory_end - 5 : memory_end]) == [*appended, "peak_memory_source"]
    stats = [f"{c}_{k}" for c in energy.SCALING_STATS for k in ("mean", "std", "ci_low", "ci_high")]
    flag = "efficiency_above_ideal"  # scalestudy.analysis.above_ideal, appended after energy
    assert list(table.columns[memory_end:]) == [*stats, "energy_source", flag]
    assert list(table.columns[:3]) == ["mode", "world_size", "nodes"]  # as before
    assert set(table["parallelism"]) == {"ddp"} and set(table["sample_unit"]) == {"images"}
    assert table["peak_memory_bytes"].isna().all()
    assert table.set_index("world_size").loc[2, "efficiency_mean"] == pytest.approx(0.9)


def test_a_tokens_run_takes_its_step_time_from_the_trainer():
    """tokens/s per rank over a batch of sequences is not a step time: the trainer's is."""
    row = run_row("scaling", 1, 8, 0.5, mode="strong", sample_unit="tokens", step_time_s=0.5)
    row["images_per_s_per_gpu"] = row["images_per_s"] = 8 * 128 / 0.5  # sequences of 128 tokens
    runs = metrics.run_metrics(pd.DataFrame([row, run_row("scaling", 1, 8, 0.25, mode="weak")]), SETTINGS)
    assert list(runs["time_per_step_s"]) == pytest.approx([0.5, 0.25])


def test_mfu_is_left_empty_for_a_workload_without_a_flop_count():
    row = run_row("scaling", 1, 8, 0.5, mode="strong", workload="command")
    del row["config.width"]
    runs = metrics.run_metrics(pd.DataFrame([row]), SETTINGS)
    assert runs["mfu"].isna().all()


def test_the_lms_mfu_comes_from_the_flops_per_token_its_trainer_counted():
    row = run_row("scaling", 1, 8, 0.5, mode="strong", workload="gpt", sample_unit="tokens", step_time_s=0.5)
    del row["config.width"]
    row["train_flops_per_image"] = 1.5e6
    runs = metrics.run_metrics(pd.DataFrame([row]), SETTINGS)
    precision = runs["precision"].iloc[0]
    peak, _ = metrics.find_peak_tflops(SETTINGS["peak_tflops"], row["device_name"], row["device"], precision)
    rate = runs["images_per_s_per_gpu"].iloc[0]  # tokens/s per rank
    assert rate > 0 and runs["mfu"].iloc[0] == pytest.approx(rate * 1.5e6 / (peak * 1e12))


# ----------------------------------------------------------------------------- sensitivity axes
# The sensitivity table's columns before the axes became a mapping (scalestudy 9904f1b), with the
# contention marks of issue 31 beside the window's (before `best`: the columns after it are axes).
TODAYS_SENSITIVITY_COLUMNS = [
    "precision",
    "precision_effective",
    "per_gpu_batch",
    "bucket_cap_mb",
    "world_size",
    "global_batch",
    "images_per_s",
    "images_per_s_per_gpu",
    "time_per_step_s",
    "epoch_time_s",
    "mfu",
    "final_test_acc",
    "measured_steps",
    "images_per_s_cv",
    "window_filled",
    "contended",
    "contention",
    "monitor_window_samples",
    "monitor_window_short",
    "throughput_source",
    "note",
    "baseline_images_per_s_per_gpu",
    "baseline_window_filled",
    "baseline_contended",
    "gain_vs_baseline",
    "best",
]


def sweep_rows(hooks=("none",)) -> list[dict]:
    rows = [run_row("baseline", 1, 16, 16 / 100.0)]
    for precision in ("fp32", "bf16"):
        for batch in (32, 16):
            for bucket in (25, 1):
                for hook in hooks:
                    rate = 100.0 * (1.5 if precision == "bf16" else 1) * batch / 16 * (1 + bucket / 100)
                    rate *= 1.1 if hook == "fp16_compress" else 1.0
                    extra = {
                        "config.precision": precision,
                        "config.bucket_cap_mb": bucket,
                        "config.comm_hook": hook,
                    }
                    rows.append(run_row("sensitivity", 2, batch, batch / rate, **extra))
    return rows


def test_the_default_axes_give_todays_table():
    runs = metrics.run_metrics(pd.DataFrame(sweep_rows()), SETTINGS)
    table = metrics.sensitivity_table(runs)
    assert list(table.columns) == [*TODAYS_SENSITIVITY_COLUMNS, "sample_unit"]
    keys = list(zip(table["precision"], table["per_gpu_batch"], table["bucket_cap_mb"], strict=True))
    assert keys == sorted(keys) and len(keys) == 8
    best = table[table["best"]].iloc[0]
    assert (best["precision"], best["per_gpu_batch"], best["bucket_cap_mb"]) == ("bf16", 32, 25)
    assert best["gain_vs_baseline"] == pytest.approx(1.5 * 2 * 1.25 - 1)
    assert set(table["sample_unit"]) == {"images"}


def test_a_further_axis_is_a_column_and_sorts_the_rows():
    runs = metrics.run_metrics(pd.DataFrame(sweep_rows(hooks=("none", "fp16_compress"))), SETTINGS)
    axes = ["comm_hook", "precision", "per_gpu_batch", "bucket_cap_mb"]
    table = metrics.sensitivity_table(runs, axes)
    assert list(table.columns[: len(TODAYS_SENSITIVITY_COLUMNS)]) == TODAYS_SENSITIVITY_COLUMNS
    assert list(table.columns[-2:]) == ["comm_hook", "sample_unit"]
    assert list(table["comm_hook"]) == ["fp16_compress"] * 8 + ["none"] * 8  # the first axis sorts first
    assert table.loc[table["best"], "comm_hook"].tolist() == ["fp16_compress"]


def test_an_axis_without_its_run_config_column_is_named():
    runs = metrics.run_metrics(pd.DataFrame(sweep_rows()), SETTINGS)
    with pytest.raises(ValueError, match=r"sensitivity runs: missing column\(s\) config\.no_such_key"):
        metrics.sensitivity_table(runs, ["no_such_key", "precision"])


def test_an_axis_value_left_at_the_trainers_default_is_filled_in():
    """The grid writes parallelism (and other keys) into a run config only where it is not the
    trainer's default: the sensitivity table shows the default there, not an empty cell."""
    rows = sweep_rows()
    for index, row in enumerate(rows):
        row["config.parallelism"] = "fsdp" if index % 2 else None
    runs = metrics.run_metrics(pd.DataFrame(rows), SETTINGS)
    table = metrics.sensitivity_table(runs, ["parallelism", "precision"])
    assert sorted(set(table["parallelism"])) == ["ddp", "fsdp"]
    without_column = runs.drop(columns="config.parallelism")
    filled = metrics.sensitivity_table(without_column, ["parallelism", "precision"])
    assert set(filled["parallelism"]) == {"ddp"}


def test_the_metrics_cli_takes_the_axes(tmp_path):
    pd.DataFrame(sweep_rows(hooks=("none", "fp16_compress"))).to_csv(tmp_path / "runs.csv", index=False)
    out = {name: str(tmp_path / f"{name}.csv") for name in ("scaling", "sensitivity")}
    argv = ["--runs", str(tmp_path / "runs.csv"), "--analysis-json", "{}", "--axes", "comm_hook", "precision"]
    metrics.main([*argv, "--scaling-out", out["scaling"], "--sensitivity-out", out["sensitivity"]])
    assert pd.read_csv(out["sensitivity"])["comm_hook"].iloc[0] == "fp16_compress"


# ----------------------------------------------------------------------------- figures
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


# ----------------------------------------------------------------------------- the paper
def test_the_efficiency_table_names_the_parallelism_and_the_unit():
    table = scaling_of(series_runs("ddp", 0.8, MIB) + series_runs("fsdp", 0.5, MIB))
    tex = tables.efficiency_table(table, unit="rank")
    header = next(line for line in tex.splitlines() if line.startswith("Mode"))
    assert header.startswith("Mode & Parallelism & Ranks & Batch/rank & Tokens/s &")
    assert r"strong & FSDP & 4 & 16 &" in tex
    ddp_only = tables.efficiency_table(scaling_of([run_row("scaling", 1, 64, T1, mode="weak")]))
    assert "Parallelism" not in ddp_only and "Mode & GPUs & Batch/GPU & Images/s &" in ddp_only


def test_the_sensitivity_table_has_a_column_per_axis():
    runs = metrics.run_metrics(pd.DataFrame(sweep_rows(hooks=("none", "fp16_compress"))), SETTINGS)
    axes = ["comm_hook", "precision", "per_gpu_batch", "bucket_cap_mb"]
    tex = tables.sensitivity_table(metrics.sensitivity_table(runs, axes), axes=axes)
    assert "comm hook & Precision & Batch/GPU & Bucket (MB) & Images/s/GPU &" in tex
    body = [line for line in tex.splitlines() if line.startswith(("fp16", "none"))]
    assert body[0].startswith(r"fp16\_compress & fp32 & 16 & 1 &") and body[-1].startswith(
        "none & bf16 & 32 & 25"
    )


def lm_tables() -> dict:
    rows = series_runs("ddp", 0.8, 40 * MIB) + series_runs("fsdp", 0.5, 40 * MIB)
    gpt = {"workload": "gpt", "config.gpt.layers": 4, "config.gpt.heads": 4, "config.gpt.d_model": 128}
    rows.append(run_row("baseline", 1, 16, 0.1, final_test_loss=2.0, final_test_perplexity=math.exp(2.0)))
    runs = pd.DataFrame(rows).assign(**gpt, **{"config.gpt.seq_len": 128, "device": "cpu"})
    per_run = metrics.run_metrics(runs, SETTINGS)
    return {"runs": runs, "scaling": metrics.scaling_table(per_run, SETTINGS)}


def value(built, name: str) -> str:
    return built.macros[name].value


def test_the_lm_paper_names_its_model_unit_and_memory():
    built = numbers.build(
        lm_tables(), {"data_source": "synthetic", "workload": "gpt", "sample_unit": "tokens"}
    )
    assert value(built, "ModelName") == (
        "a GPT-style decoder language model (4 layers, 4 heads, width 128, context 128 tokens)"
    )
    assert value(built, "ParallelismName") == r"DDP~\cite{pytorchddp} and FSDP~\cite{zhao2023fsdp}"
    assert value(built, "DataSource").startswith("a synthetic text corpus")
    assert "CIFAR" not in value(built, "DataCaveat") and value(built, "Optimizer") == "AdamW"
    assert value(built, "BatchItems") == "sequences" and value(built, "SampleUnit") == "tokens"
    assert value(built, "BaselineThroughput").endswith("~tokens/s")
    assert value(built, "BaselineQuality") == "It ends at a test loss of 2 (perplexity 7.39)."
    assert value(built, "StrongEffAtLargest") == r"80.0\,\%"  # the DDP series
    memory_sentence = value(built, "MemorySummary")
    assert "at 4 CPU ranks" in memory_sentence
    assert "with DDP 40~MiB of model state and 100~MiB at peak and with FSDP 10~MiB" in memory_sentence
    assert "loss as perplexity" in value(built, "QualityCaption")


def test_the_resnet_paper_reads_as_before():
    rows = [run_row("baseline", 1, 128, 0.16)]
    rows += [run_row("scaling", n, 1024 // n, T1 / n, mode="strong") for n in (1, 2)]
    rows += [
        run_row("sensitivity", 2, b, b / ips, **{"config.precision": p, "config.bucket_cap_mb": 25})
        for p, b, ips in (("fp32", 64, 800.0), ("bf16", 128, 1500.0))
    ]
    runs = pd.DataFrame(rows)
    per_run = metrics.run_metrics(runs, SETTINGS)
    built = numbers.build(
        {
            "runs": runs,
            "scaling": metrics.scaling_table(per_run, SETTINGS),
            "sensitivity": metrics.sensitivity_table(per_run),
        },
        {"data_source": "cifar10"},
    )
    assert value(built, "ModelName") == "ResNet-18 (CIFAR variant, base width 64)"
    assert value(built, "ModelCite") == r"~\cite{he2016resnet}" and value(built, "Optimizer") == "SGD"
    assert value(built, "ParallelismName") == r"DDP~\cite{pytorchddp}"
    assert value(built, "SensitivityAxes") == "the DDP bucket size, the per-GPU batch and the precision"
    assert value(built, "SensitivityBestPoint") == "bf16 with batch 128 and 25~MB buckets"
    assert value(built, "BaselineQuality").startswith(
        r"It ends at 90.0\,\% test accuracy and reaches the target"
    )
    assert value(built, "MemorySummary") == "Memory per rank was not recorded by these runs."
