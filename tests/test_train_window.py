"""The trainer's steady-state measurement window in CPU runs of their own (tests/trainer_runs.py):
when the trainer synchronises (at the window's edges, never per step), and a run too short to fill
its window, reported by the trainer and marked by the analysis and the throughput figure. The
windows measured against the reference run (across an epoch, restarted by a resume, in seconds)
are in tests/test_train.py; two ranks agreeing on a window in seconds, in tests/test_train_ddp.py.
"""

import numpy as np
import pandas as pd
import pytest

from scalestudy.train import trainer as train
from tests.inprocess import one_process_one_thread  # noqa: F401 (autouse)
from tests.trainer_runs import main, run_maker, summary_results


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return run_maker(tmp_path_factory)


@pytest.mark.parametrize("epochs", [2, 3])
def test_the_trainer_synchronises_at_the_window_edges_never_per_step(runs, monkeypatch, epochs):
    """start, after the first step, window open, 4 sub-interval ends, and the two edges of the one
    pause inside the window (the evaluation after epoch 1): 9, however many steps the run has."""
    calls = []
    monkeypatch.setattr(
        train.Trainer, "synchronize", lambda self: calls.append(self.state.position.global_step)
    )
    out, _, config = runs(f"syncs_{epochs}", epochs=epochs, checkpoint_every_steps=0, step_timing_every=0)
    assert main(out, config) == 0
    # the position's global step at each call: after a step, the index of that step (0 = the first;
    # the window opens after step 3 and its intervals end after steps 7, 11, 15, 19); at the
    # epoch-end pause, the 12 steps done
    assert calls == [0, 0, 3, 7, 11, 12, 12, 15, 19]


def test_a_run_too_short_to_fill_its_window_says_so(runs, capsys):
    out, _, config = runs("short_window", epochs=1, max_steps_per_epoch=6, eval_max_batches=1)
    assert main(out, config) == 0
    r = summary_results(out)
    assert r["window_filled"] is False and r["measured_steps"] == 2  # steps 4 and 5
    assert r["images_per_s"] is None and r["images_per_s_per_gpu"] is None and r["step_time_s"] is None
    assert r["whole_run_images_per_s"] > 0 and r["whole_run_step_time_s"] > 0
    assert "measurement window not filled: 2 of 16 steps" in capsys.readouterr().err


def test_the_analysis_marks_a_run_that_did_not_fill_its_window(runs, tmp_path, monkeypatch):
    """Two real one-rank runs of 6 steps: weak fills a window of 4, strong cannot fill one of 16.
    runs.csv -> scaling.csv mark the strong point, and the throughput figure draws it hollow."""
    from scalestudy.analysis import aggregate, metrics, settings
    from scalestudy.plots import scaling, style

    short = {"epochs": 1, "max_steps_per_epoch": 6, "eval_max_batches": 1, "precision": "fp32"}
    short["stage"] = "scaling"
    summaries = []
    for mode, steps in (("weak", 4), ("strong", 16)):
        window = {"measure_warmup_steps": 1, "measure_steps": steps, "measure_intervals": 2}
        out, _, config = runs(f"analysis_{mode}", **short, **window, mode=mode, point=f"{mode}/w1_r0")
        assert main(out, config) == 0
        summaries.append(out / "summary.json")
    catalog = aggregate.build_catalog(summaries)
    catalog.to_csv(tmp_path / "runs.csv", index=False)
    stored = pd.read_csv(tmp_path / "runs.csv").set_index("config.mode")
    assert stored.loc["weak", "window_filled"] and not stored.loc["strong", "window_filled"]
    assert np.isnan(stored.loc["strong", "images_per_s"]) and stored.loc["strong", "measured_steps"] == 5
    analysis = settings.resolved({})
    table = metrics.scaling_table(metrics.run_metrics(pd.read_csv(tmp_path / "runs.csv"), analysis), analysis)
    table = table.set_index("mode")
    assert not table.loc["strong", "window_filled"] and "window not filled" in table.loc["strong", "note"]
    assert table.loc["weak", "window_filled"] and table.loc["strong", "images_per_s_mean"] > 0  # whole run
    drawn = []
    monkeypatch.setattr(style, "save_figure", lambda fig, png, pdf=None: drawn.append(fig))
    scaling.throughput(table.reset_index(), tmp_path / "throughput.png")
    hollow = [line for line in drawn[0].axes[0].get_lines() if line.get_markerfacecolor() == "white"]
    assert [list(line.get_xdata()) for line in hollow] == [[1], []]  # the point, its legend entry
    assert scaling.UNFILLED_LABEL in [t.get_text() for t in drawn[0].axes[0].get_legend().get_texts()]
