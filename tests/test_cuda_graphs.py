"""CUDA graphs in the study's points (issue 51), without a GPU: the compile mode `auto`, what a run
records of its graphs (Inductor's skip counter and the reason it logs, driven here through Inductor's
own skip function: the fake counters of a GPU run), a demand for graphs that fails the run, the
compiled artifacts of another torch left unloaded, and the mark a skipped point gets in the tables."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
import torch
from torch._dynamo.utils import counters
from torch._inductor.cudagraph_utils import log_cudagraph_skip_and_bump_counter

from scalestudy.analysis import graphs, metrics, settings
from scalestudy.train import compiled

CUDA, CPU = torch.device("cuda", 0), torch.device("cpu")
MUTATED = "skipping cudagraphs due to mutated inputs (2 instances). Found from : \n   File ..., line 1"


def test_auto_is_cuda_graphs_on_a_gpu_and_the_default_mode_on_the_cpu():
    assert compiled.resolve_mode("auto", CUDA, "ddp") == "reduce-overhead"
    assert compiled.resolve_mode("auto", CPU, "ddp") == "default"
    assert compiled.resolve_mode("auto", CUDA, "fsdp") == "default"  # FSDP2 re-gathers its parameters
    assert not compiled.graphs_expected(True, "auto", CUDA, "fsdp")
    assert compiled.resolve_mode("max-autotune-no-cudagraphs", CUDA, "ddp") == "max-autotune-no-cudagraphs"
    assert compiled.graphs_expected(True, "auto", CUDA, "ddp") and compiled.graphs_expected(
        True, "max-autotune", CUDA, "ddp"
    )
    assert not compiled.graphs_expected(True, "auto", CPU, "ddp")  # no graphs on the CPU
    assert not compiled.graphs_expected(False, "reduce-overhead", CUDA, "ddp")  # eager
    assert not compiled.graphs_expected(True, "default", CUDA, "ddp")


def gpu_settings(**changes) -> compiled.CompileSettings:
    """A GPU run's settings in mode reduce-overhead (its graphs expected), no cache folder."""
    base = {
        "compile": True,
        "mode": "reduce-overhead",
        "graphs_expected": True,
        "graphs_required": False,
        "cache_dir": None,
        "cache_load": None,
        "cache_save": None,
    }
    return compiled.CompileSettings(**{**base, **changes})


@pytest.fixture
def step():
    """A prepared CompiledStep (its counters' start taken), closed afterwards."""
    made = []

    def make(**changes):
        made.append(compiled.CompiledStep(gpu_settings(**changes)))
        made[-1].prepare()
        return made[-1]

    yield make
    for each in made:
        each.close()


def graphs_compiled(count: int) -> None:
    """What Dynamo and Inductor count as they capture and compile (or load) the step's graphs."""
    counters["stats"]["unique_graphs"] += 1
    counters["inductor"]["fxgraph_cache_miss"] += count


def test_a_run_whose_graphs_ran_says_so(step):
    run = step()
    graphs_compiled(2)
    result = run.result(compile_s=3.0)["cuda_graphs"]
    assert result == {
        "expected": True,
        "required": False,
        "mode": "reduce-overhead",
        "skips": 0,
        "skip_reasons": None,
        "used": True,
        "skipped": False,
    }


def test_a_skipped_graph_is_counted_with_inductors_reason_and_marks_the_run(step, caplog):
    run = step()
    graphs_compiled(2)
    log_cudagraph_skip_and_bump_counter(MUTATED)  # what Inductor calls for each graph it skips
    log_cudagraph_skip_and_bump_counter(MUTATED)
    result = run.result(compile_s=3.0)
    graph = result["cuda_graphs"]
    assert (graph["skips"], graph["used"], graph["skipped"]) == (2, False, True)
    assert graph["skip_reasons"] == MUTATED  # once, however often it was logged
    assert "CUDA graphs expected (mode reduce-overhead) but 2 skipped" in caplog.text
    assert result["compile"]["cache"]["fxgraph_misses"] == 2


def test_the_counters_are_the_runs_own_not_the_processes(step):
    log_cudagraph_skip_and_bump_counter(MUTATED)  # an earlier run in this process
    run = step()
    graphs_compiled(2)
    assert run.result(compile_s=1.0)["cuda_graphs"]["skips"] == 0


def test_a_graph_mode_that_compiled_nothing_did_not_run_graphs(step):
    assert step().result(compile_s=0.0)["cuda_graphs"]["skipped"] is True


def test_on_the_cpu_and_eager_no_graphs_are_expected_or_marked(step):
    cpu = step(mode="default", graphs_expected=False)
    graphs_compiled(2)
    log_cudagraph_skip_and_bump_counter("skipping cudagraphs due to cpu device (arg0_1)")
    graph = cpu.result(compile_s=1.0)["cuda_graphs"]
    assert (graph["expected"], graph["used"], graph["skipped"], graph["skips"]) == (False, None, False, 1)
    eager = compiled.CompiledStep(gpu_settings(compile=False, graphs_expected=False))
    eager.prepare()
    assert eager.result(compile_s=None) == {}  # an eager run's summary has neither


def test_a_run_that_requires_graphs_fails_at_the_first_skip_and_leaves_the_setting_as_it_was(step):
    import torch._inductor.config as inductor_config

    before = inductor_config.triton.cudagraph_or_error
    run = step(graphs_required=True)
    assert inductor_config.triton.cudagraph_or_error is True
    with pytest.raises(RuntimeError, match="mutated inputs"):
        log_cudagraph_skip_and_bump_counter(MUTATED)
    run.close()
    assert inductor_config.triton.cudagraph_or_error is before
    step(graphs_required=True, graphs_expected=False)  # on the CPU: nothing to require
    assert inductor_config.triton.cudagraph_or_error is before


def test_artifacts_of_another_torch_or_device_are_not_loaded(tmp_path):
    artifacts = tmp_path / "artifacts.bin"
    artifacts.write_bytes(b"not loaded")
    record = {"software": {**compiled.software(), "torch": "2.0.0", "device": "NVIDIA H100 (sm_90)"}}
    compiled.record_path(artifacts).write_text(json.dumps(record))
    found = compiled.load_artifacts(artifacts)
    assert found["loaded"] is False and "made with torch 2.0.0 (here " in found["reason"]
    assert "device NVIDIA H100 (sm_90) (here None)" in found["reason"]
    missing = compiled.load_artifacts(tmp_path / "none" / "artifacts.bin")
    assert missing["loaded"] is False and "no compile job" in missing["reason"]


# -- the tables: a run whose graphs were skipped is marked and noted --


def catalog_rows() -> pd.DataFrame:
    """Two sensitivity runs as runs.csv has them; the second's CUDA graphs were skipped."""
    common = {"stage": "sensitivity", "world_size": 1, "global_batch": 256, "per_gpu_batch": 256}
    common |= {"images_per_s": 50_000.0, "images_per_s_per_gpu": 50_000.0, "epoch_time_s": 1.0}
    common |= {"total_time_s": 10.0, "config.width": 64, "config.precision": "bf16", "device": "cuda"}
    common |= {"device_name": "NVIDIA H200", "final_test_acc": 0.5, "time_to_target_s": math.nan}
    rows = [
        {**common, "point": "bf16/bs256", "cuda_graphs.expected": True, "cuda_graphs.skipped": False},
        {
            **common,
            "point": "bf16/bs512",
            "per_gpu_batch": 512,
            "cuda_graphs.expected": True,
            "cuda_graphs.skipped": True,
            "cuda_graphs.skip_reasons": "skipping cudagraphs due to mutated inputs (2 instances)",
        },
    ]
    baseline = {**common, "stage": "baseline", "point": "default", "cuda_graphs.skipped": None}
    return pd.DataFrame([*rows, baseline])


def test_the_sensitivity_table_marks_the_run_whose_graphs_were_skipped():
    runs = metrics.run_metrics(catalog_rows(), settings.resolved({}))
    table = metrics.sensitivity_table(runs, ["precision", "per_gpu_batch"])
    marked = table.set_index("per_gpu_batch")[graphs.COLUMN]
    assert marked.to_dict() == {256: False, 512: True}
    note = table.set_index("per_gpu_batch").loc[512, "note"]
    assert note == f"{graphs.NOTE}: skipping cudagraphs due to mutated inputs (2 instances)"
    assert not runs.set_index("point").loc["default", graphs.COLUMN]  # eager: nothing expected


def test_a_catalog_from_before_the_graphs_were_recorded_marks_nothing():
    old = catalog_rows().drop(columns=[c for c in catalog_rows() if c.startswith("cuda_graphs.")])
    old["note"] = ""
    assert not graphs.mark(old)[graphs.COLUMN].any()


def test_the_papers_tables_and_threats_mark_the_point_whose_graphs_were_skipped():
    """The paper's sensitivity and efficiency tables mark the point (and the series' point whose
    repeats lost their graphs) with a double dagger and say why; its threats name the point and
    Inductor's reason. A study where no run asked for graphs says nothing of them."""
    from scalestudy.paper import discussion, tables
    from scalestudy.paper.macros import Numbers
    from scalestudy.paper.sections import Data

    runs = metrics.run_metrics(catalog_rows(), settings.resolved({}))
    sweep = metrics.sensitivity_table(runs, ["precision", "per_gpu_batch"])
    tex = tables.sensitivity_table(sweep, axes=["precision", "per_gpu_batch"])
    marked = [line for line in tex.splitlines() if tables.GRAPHS_SKIPPED_MARK in line]
    assert len(marked) == 2 and marked[0].startswith("bf16 & 512 &"), tex  # the row, then the note
    assert f"{tables.GRAPHS_SKIPPED_NOTE}." in marked[1]
    scaling = pd.DataFrame(
        {"mode": "strong", "world_size": [1, 2], "per_gpu_batch": 256, "images_per_s_mean": [1e4, 1.9e4]}
        | {"speedup_mean": [1.0, 1.9], "efficiency_mean": [1.0, 0.95], "mfu_mean": 0.3, "repeats": 1}
        | {"efficiency_ci_low": float("nan"), "efficiency_ci_high": float("nan")}
        | {"repeats_graphs_skipped": [0, 1]}
    )
    tex = tables.efficiency_table(scaling)
    rows = [line.split(" & ") for line in tex.splitlines() if " & " in line]
    assert [row[1] for row in rows if tables.GRAPHS_SKIPPED_MARK in row[3]] == ["2"]
    assert f"{tables.GRAPHS_SKIPPED_NOTE}." in tex

    def item(catalog: pd.DataFrame) -> str:
        built = Numbers()
        discussion.cuda_graphs(
            built,
            Data(
                {"runs": catalog}, {"workload": "resnet18-cifar10", "sample_unit": "images", "device": "cuda"}
            ),
        )
        return built.macros["CudaGraphsItem"].value

    text = item(catalog_rows())
    assert text.startswith(
        r"\item \emph{CUDA graphs.} Runs whose compiled step was to replay CUDA graphs: 2 of 3"
    )
    assert "skipped the graphs of 1 (sensitivity/bf16/bs512; Inductor's reason: skipping cudagraphs" in text
    eager = catalog_rows().drop(columns=["cuda_graphs.expected", "cuda_graphs.skipped"])
    assert item(eager) == ""


def test_the_sensitivity_heatmap_dots_the_cell_whose_graphs_were_skipped(monkeypatch):
    from scalestudy.plots import sensitivity as sensitivity_plots
    from scalestudy.plots import style

    kept = []
    monkeypatch.setattr(style, "save_figure", lambda fig, png, pdf=None: kept.append(fig))
    runs = metrics.run_metrics(catalog_rows(), settings.resolved({}))
    table = metrics.sensitivity_table(runs, ["precision", "per_gpu_batch"])
    sensitivity_plots.heatmaps(table, "unused.png", axes=["precision", "per_gpu_batch"])
    patches = [patch for ax in kept[0].axes for patch in ax.patches]
    dotted = [p for p in patches if p.get_hatch() == sensitivity_plots.GRAPHS_SKIPPED_STYLE["hatch"]]
    assert [p.get_x() + 0.5 for p in dotted] == [1.0]  # the column of batch 512
    legend = [text.get_text() for legend in kept[0].legends for text in legend.get_texts()]
    assert sensitivity_plots.GRAPHS_SKIPPED_LABEL in legend
