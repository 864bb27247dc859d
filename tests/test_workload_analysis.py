"""The analysis and paper of any workload: the run catalog, per-(mode, parallelism) series, memory
per rank, the workload's unit, the sensitivity sweep's generic axes, the paper's tables and wording.
Known answers on small constructed tables; the ResNet/DDP tables stay as they were. Their figures:
test_workload_figures.py."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from scalestudy.analysis import aggregate, energy, metrics, mfu
from scalestudy.analysis.constructed_study import run_row
from scalestudy.paper import numbers, tables
from tests.workload_runs import MIB, SETTINGS, T1, scaling_of, series_runs, sweep_rows


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
    assert list(table.columns[memory_end:]) == [*stats, "energy_source", "mfu_note", flag]
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
    peak, _ = mfu.find_peak_tflops(SETTINGS["peak_tflops"], row["device_name"], row["device"], precision)
    rate = runs["images_per_s_per_gpu"].iloc[0]  # tokens/s per rank
    assert rate > 0 and runs["mfu"].iloc[0] == pytest.approx(rate * 1.5e6 / (peak * 1e12))


# ----------------------------------------------------------------------------- sensitivity axes
# The sensitivity table's columns before the axes became a mapping (scalestudy 9904f1b), with the
# contention marks of issue 31 beside the window's and mfu_note beside mfu (issue 54), all before `best`
# (the columns after it are axes).
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
    "mfu_note",
    "final_test_acc",
    "measured_steps",
    "images_per_s_cv",
    "window_filled",
    "contended",
    "contention",
    "monitor_window_samples",
    "monitor_window_short",
    "cuda_graphs_skipped",
    "throughput_source",
    "note",
    "baseline_images_per_s_per_gpu",
    "baseline_window_filled",
    "baseline_contended",
    "gain_vs_baseline",
    "best",
]


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
