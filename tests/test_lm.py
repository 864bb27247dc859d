"""The GPT workload through the trainer: tokens as the unit, FSDP2 against DDP, DCP checkpoints
that resume bit-exactly at a fixed world size and reshard 2 -> 1 -> 2 ranks with the same global
batch. CPU and gloo; 2-rank runs under torchrun."""

# ruff: noqa: F811 - the fixtures imported from tests/lm_runs.py are the tests' parameters

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from scalestudy import contract
from scalestudy.plan import runconfig
from scalestudy.train import program
from scalestudy.train.checkpoint import dcp as sharded_checkpoint
from scalestudy.workloads.gpt import model as gpt_model
from tests import lm_runs
from tests.inprocess import SignalAtStep, one_process_one_thread  # noqa: F401 - autouse
from tests.lm_runs import GPT, TWO_RANKS, data_dir, runs  # noqa: F401 - data_dir, runs: fixtures
from tests.trainer_runs import main


@pytest.fixture(scope="module")
def reference(runs):
    out, ckpt, config = runs("reference")
    assert main(out, config) == 0
    return out, ckpt, config


@pytest.fixture(scope="module")
def two_rank_runs(runs):
    """Uninterrupted 2-rank runs, DDP and FSDP2, of the reference's global batch."""
    done = {}
    for parallelism in ("ddp", "fsdp"):
        out, ckpt, config = runs(f"two_{parallelism}", parallelism=parallelism, **TWO_RANKS)
        code, log = lm_runs.torchrun(out, config)
        assert code == 0, log[-5000:]
        done[parallelism] = (out, ckpt, config)
    return done


def test_the_lm_learns_and_reports_in_tokens(reference):
    out, _, config = reference
    results, metrics = lm_runs.results(out), pd.read_csv(out / "metrics.csv")
    assert results["workload"] == "gpt" and results["sample_unit"] == "tokens"
    assert results["metric"] == "perplexity" and results["optimizer"] == "adamw"
    assert metrics["train_loss"].iloc[-1] < metrics["train_loss"].iloc[0] < math.log(256)
    assert results["final_test_perplexity"] == pytest.approx(math.exp(results["final_test_loss"]))
    cfg = gpt_model.config_from(GPT, 256)
    assert results["train_flops_per_image"] == gpt_model.train_flops_per_token(cfg)
    assert results["parameters"] == gpt_model.parameter_count(cfg)
    # every step trains per_gpu_batch x seq_len tokens: the window's rate is tokens per second
    assert results["images_per_s"] == pytest.approx(
        results["measured_steps"] * config["global_batch"] * GPT["seq_len"] / results["measured_s"]
    )
    # fp32 parameters, their gradients, AdamW's two moments: 16 bytes a parameter on one rank
    assert results["model_state_bytes_per_rank"] == 16 * results["parameters"]
    assert results["peak_memory_source"] == "cpu_peak_rss" and results["peak_memory_bytes"] > 0


def test_a_killed_lm_run_resumes_bit_exactly(runs, reference):
    out, ckpt, config = runs("signal")
    with SignalAtStep(5):
        assert main(out, config) == contract.EXIT_RESUMABLE
    assert sharded_checkpoint.latest(ckpt)[0]["position"]["global_step"] == 5
    assert main(out, config) == 0
    theirs, ours = lm_runs.weights(reference[1]), lm_runs.weights(ckpt)
    assert [k for k in ours if not torch.equal(ours[k], theirs[k])] == []
    pd.testing.assert_frame_equal(lm_runs.metrics(out), lm_runs.metrics(reference[0]))
    assert lm_runs.results(out)["resumes"] == [5]


def test_fsdp2_and_ddp_train_the_same_weights(two_rank_runs, reference):
    ddp, fsdp = lm_runs.weights(two_rank_runs["ddp"][1]), lm_runs.weights(two_rank_runs["fsdp"][1])
    start = lm_runs.initial_weights()
    assert lm_runs.relative_difference(fsdp, ddp, start) < 1e-4
    one_rank = lm_runs.weights(reference[1])
    assert lm_runs.relative_difference(ddp, one_rank, start) < 1e-4  # 2 x 8 trains like 1 x 16
    fsdp_results = lm_runs.results(two_rank_runs["fsdp"][0])
    ddp_results = lm_runs.results(two_rank_runs["ddp"][0])
    assert fsdp_results["parallelism"] == "fsdp" and fsdp_results["fsdp_options"]["shard_units"] == 2
    # FSDP2 holds half of the model state on each of 2 ranks (up to the shards' padding)
    assert fsdp_results["model_state_bytes_per_rank"] < 0.55 * ddp_results["model_state_bytes_per_rank"]
    assert len(fsdp_results["peak_memory_bytes_per_rank"]) == 2


def test_fsdp2_at_one_rank_trains_like_one_rank_without_resharding_and_at_two_ranks_reshards(
    runs, reference, two_rank_runs
):
    """One rank: the blocks keep their parameters after the forward (train.reshard_after_forward is
    true, but there it only costs); two ranks: the blocks reshard, the root never does. What took
    effect is read from the modules' FSDP2 state (summary.json's fsdp_options)."""
    out, ckpt, config = runs("one_fsdp", parallelism="fsdp")
    assert main(out, config) == 0
    start = lm_runs.initial_weights()
    assert lm_runs.relative_difference(lm_runs.weights(ckpt), lm_runs.weights(reference[1]), start) < 1e-4
    pd.testing.assert_frame_equal(lm_runs.metrics(out), lm_runs.metrics(reference[0]), rtol=1e-4)
    assert "reshard_after_forward" not in config and runconfig.DEFAULTS["reshard_after_forward"] is True
    one, two = lm_runs.results(out)["fsdp_options"], lm_runs.results(two_rank_runs["fsdp"][0])["fsdp_options"]
    assert one["reshard_after_forward"] is False and one["resharded_after_forward"] == []
    assert two["reshard_after_forward"] is True and two["resharded_after_forward"] == ["blocks.0", "blocks.1"]


def test_a_checkpoint_reshards_from_two_ranks_to_one_and_back(runs, two_rank_runs):
    """FSDP2 at 2 x 8 stopped near step 4, resumed at 1 x 16 and stopped near step 10, finished at 2 x 8:
    the same loss curve as the uninterrupted 2-rank run, within float rounding."""
    out, ckpt, config = runs("reshard", parallelism="fsdp", **TWO_RANKS)
    code, log = lm_runs.torchrun(out, config, stop_at_step=4)
    assert code != 0 and "exit 75" in log, log[-3000:]
    saved = sharded_checkpoint.latest(ckpt)[0]["position"]["global_step"]
    # the step the signal reached the ranks in, or the next (they agree on it); the launcher passes
    # it on a moment after the log line
    assert 4 <= saved < 10
    one_rank = runs("reshard", parallelism="fsdp", checkpoints="reshard")[2]
    with SignalAtStep(10):
        assert main(out, one_rank) == contract.EXIT_RESUMABLE
    # FSDP2 runs one rank in a process group too: the stop is agreed on after the next step
    second = sharded_checkpoint.latest(ckpt)[0]["position"]["global_step"]
    assert second in (10, 11)
    code, log = lm_runs.torchrun(out, config)
    assert code == 0, log[-5000:]
    reference_out, reference_ckpt, _ = two_rank_runs["fsdp"]
    pd.testing.assert_frame_equal(lm_runs.metrics(out), lm_runs.metrics(reference_out), rtol=1e-4)
    start = lm_runs.initial_weights()
    assert lm_runs.relative_difference(lm_runs.weights(ckpt), lm_runs.weights(reference_ckpt), start) < 1e-4
    assert lm_runs.results(out)["resumes"] == [saved, second]


def test_a_resume_that_would_change_the_global_batch_is_refused(runs, reference, capsys):
    out, ckpt, config = runs("refused")
    with SignalAtStep(3):
        assert main(out, config) == contract.EXIT_RESUMABLE
    bigger = {**config, "per_gpu_batch": 32, "global_batch": 32}
    assert main(out, bigger) == program.EXIT_BAD_CONFIG
    message = capsys.readouterr().err
    assert "global_batch=16" in message and "global_batch=32" in message
    assert sharded_checkpoint.latest(ckpt) is not None  # nothing was removed
