"""DDP on CPU over gloo: the half-precision gradient hooks in a one-rank group, and the trainer with
real processes (tests/trainer_runs.py's run on 2 ranks): under torchrun it trains like one rank of
the whole batch, two ranks agree on when a window in seconds ends, and ranks started srun-style
stop together on a signal to one of them and resume to the uninterrupted run, bit for bit (also
with plain BatchNorm stopped at an epoch's end).
"""

import json
import random
import signal
import socket
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import torch

from scalestudy import contract
from scalestudy.launch import distributed
from scalestudy.train.parallel import COMM_HOOKS
from scalestudy.train.process import seed_everything
from scalestudy.workloads.resnet_cifar import model
from tests.inprocess import one_process_one_thread  # noqa: F401 (autouse)
from tests.trainer_runs import (
    BASE,
    assert_same_weights,
    final,
    last_step,
    learning_columns,
    main,
    run_maker,
    signal_at_step,
    start_trainer,
    summary_results,
    torchrun_to_the_end,
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return run_maker(tmp_path_factory)


@pytest.mark.parametrize(("hook", "dtype"), [("fp16", torch.float16), ("bf16", torch.bfloat16)])
def test_comm_hooks_send_gradients_in_half_precision(hook, dtype):
    """One-rank gloo group: the all-reduced gradient is the local one rounded to the hook's dtype."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    distributed.init_process_group(distributed.DistEnv(0, 0, 1, "127.0.0.1", port, "single"), "gloo", 30)
    try:
        torch.manual_seed(0)
        layer = torch.nn.Linear(64, 8)
        x = torch.randn(4, 64)
        layer(x).square().sum().backward()
        exact = layer.weight.grad.clone()
        ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 8))
        ddp.module.load_state_dict(layer.state_dict())
        ddp.register_comm_hook(None, COMM_HOOKS[hook])
        ddp(x).square().sum().backward()
        reduced = ddp.module.weight.grad
        assert torch.equal(reduced, exact.to(dtype).float()) and not torch.equal(reduced, exact)
    finally:
        distributed.destroy_process_group()


# --- DDP with real processes --------------------------------------------------------------------------

DDP = {
    **{"world_size": 2, "per_gpu_batch": 8, "global_batch": 16, "norm": "frozen", "max_steps_per_epoch": 10},
    "pg_timeout_s": 60,  # a rank left waiting in a collective fails the test instead of hanging it
}
DDP_STEPS_PER_EPOCH = 10


@pytest.fixture(scope="module")
def torchrun_run(runs):
    out, ckpt, config = runs("torchrun", **DDP)
    torchrun_to_the_end(out, config)
    return out, ckpt, config


def test_two_ranks_agree_on_when_a_window_in_seconds_ends(runs):
    """Each rank times its own steps; the window's seconds are averaged over the ranks (a gloo
    all-reduce), so both plan the same steps: a disagreement would leave one rank in a collective
    the other never joins (pg_timeout_s: the run fails)."""
    changes = {"measure_steps": 2, "measure_intervals": 1, "measure_seconds": 0.3, "epochs": 6}  # 60 steps
    out, _, config = runs("torchrun_seconds", **{**DDP, **changes})
    torchrun_to_the_end(out, config)
    r = summary_results(out)
    # the agreements run as the window opens (the warm-up's rate) and as it closes (extended if short)
    assert r["window_filled"] and r["measured_s"] >= 0.25 and r["measured_steps"] == r["measure_steps"], r
    assert r["measure_start_step"] == DDP.get("measure_warmup_steps", BASE["measure_warmup_steps"]), r


def _flat(state: dict) -> torch.Tensor:
    return torch.cat([t.flatten().double() for t in state.values() if t.is_floating_point()])


EQUIVALENCE_TOLERANCE = 1e-3  # |two ranks - one rank| / |distance the weights moved|


def test_two_ranks_of_batch_b_train_like_one_rank_of_batch_2b(runs, torchrun_run):
    """With per-sample normalisation ("frozen" BatchNorm statistics; SyncBatchNorm refuses the CPU)
    and world-size-independent sharding and augmentation, DDP's averaged gradient is the big batch's
    gradient: the weights agree up to float rounding (measured ~2e-4 of the distance moved). Plain
    BatchNorm normalises each rank's 8 samples by themselves, and differs by ~100% (measured)."""
    out, ckpt, config = torchrun_run
    seed_everything(0)  # the trainer's first use of the generator is the model
    initial = _flat(model.build_model(8, norm="frozen").state_dict())
    two_ranks = _flat(final(ckpt)["model"])
    one_rank = runs("one_rank_2b", **{**DDP, "world_size": 1, "per_gpu_batch": 16})
    wrong = runs("one_rank_b", **{**DDP, "world_size": 1, "global_batch": 8, "lr_scaling": "none"})  # control
    for run in (one_rank, wrong):
        assert main(run[0], run[2]) == 0
    moved = (two_ranks - initial).norm()
    assert (_flat(final(one_rank[1])["model"]) - two_ranks).norm() / moved < EQUIVALENCE_TOLERANCE
    assert (_flat(final(wrong[1])["model"]) - two_ranks).norm() / moved > 100 * EQUIVALENCE_TOLERANCE
    summary = json.loads((out / "summary.json").read_text())
    assert summary["results"]["world_size"] == 2 and summary["results"]["backend"] == "gloo"
    assert summary["provenance"]["launcher"] == "torchrun" and len(summary["provenance"]["ranks"]) == 2
    assert len(json.loads((out / "gpu_monitor.json").read_text())["nodes"]) == 1  # one sampler per node
    parts = summary["results"]["step_parts"]  # every rank's, gathered when the window filled
    assert len(parts["step_s"]) == len(parts["data_wait_s"]) == len(parts["gradient_wait_s"]) == 2
    assert parts["step_s"][0] == pytest.approx(summary["results"]["step_time_s"])
    assert all(0 < wait < step for wait, step in zip(parts["gradient_wait_s"], parts["step_s"], strict=True))


def _free_slurm_job_id() -> int:
    """A job id whose derived rendezvous port is free here (the srun path derives it)."""
    for job_id in random.Random().sample(range(1000), 50):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", distributed.slurm_port(str(job_id))))
                return job_id
            except OSError:
                continue
    pytest.skip("no free port in the Slurm-derived range")


def _srun_style_ranks(out, config, job_id: int, rank1_log: Path) -> list[subprocess.Popen]:
    """Two ranks started the way srun starts them: SLURM_* variables only, no MASTER_*."""
    env = {"SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "localhost", "SLURM_JOB_ID": str(job_id)}
    rank0 = start_trainer(out, config, {**env, "SLURM_PROCID": "0", "SLURM_LOCALID": "0"})
    with open(rank1_log, "a") as log:  # nobody reads rank 1's pipe while it runs: a file cannot fill up
        rank1 = start_trainer(out, config, {**env, "SLURM_PROCID": "1", "SLURM_LOCALID": "1"}, stderr=log)
    return [rank0, rank1]


def test_srun_style_ranks_stop_together_on_a_signal_to_one_and_resume_exactly(runs, torchrun_run, tmp_path):
    """SIGTERM reaches rank 1 only: both ranks agree, checkpoint the same step and exit 75; the
    retry (srun-style again) ends with the torchrun run's weights, bit for bit."""
    out, ckpt, config = runs("srun", **DDP)
    step = random.Random(3).randrange(2, 2 * DDP_STEPS_PER_EPOCH - 3)
    job_id = _free_slurm_job_id()
    rank0, rank1 = _srun_style_ranks(out, config, job_id, tmp_path / "rank1.log")
    log = signal_at_step(rank0, step, signal.SIGTERM, target_pid=rank1.pid)
    rank1.wait(timeout=120)
    assert (rank0.returncode, rank1.returncode) == (contract.EXIT_RESUMABLE,) * 2, log
    stopped_at = final(ckpt)["position"]["global_step"]
    assert step <= stopped_at == last_step(log)
    ranks = _srun_style_ranks(out, config, job_id, tmp_path / "rank1.log")
    log = ranks[0].communicate(timeout=300)[1]
    ranks[1].wait(timeout=60)
    assert [rank.returncode for rank in ranks] == [0, 0], log[-3000:] + (tmp_path / "rank1.log").read_text()
    assert_same_weights(final(ckpt)["model"], final(torchrun_run[1])["model"])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["results"]["resumed_from_step"] == stopped_at
    assert summary["provenance"]["launcher"] == "srun"


@pytest.fixture(scope="module")
def torchrun_batchnorm_run(runs):
    """Two ranks with plain BatchNorm (statistics per rank), uninterrupted."""
    out, ckpt, config = runs("torchrun_bn", **{**DDP, "norm": "batch"})
    torchrun_to_the_end(out, config)
    return out, ckpt, config


def test_two_ranks_stopped_after_an_epochs_last_step_resume_to_the_same_metrics_bit_for_bit(
    runs, torchrun_batchnorm_run, tmp_path
):
    """The ranks' BatchNorm statistics differ while training (no buffer broadcast); a resume hands
    every rank rank 0's. Evaluation takes rank 0's on every rank, so the test metrics (and the
    carried float64 train totals) are the same whether or not the run stopped at the epoch end."""
    out, ckpt, config = runs("srun_epoch_end", **{**DDP, "norm": "batch"})
    job_id = _free_slurm_job_id()
    rank0, rank1 = _srun_style_ranks(out, config, job_id, tmp_path / "rank1.log")
    # signalled while step 10 (the epoch's last) runs or rank 0 waits for step 9's agreement: the
    # ranks stop after step 10, before the epoch's evaluation or right after it
    log = signal_at_step(rank0, DDP_STEPS_PER_EPOCH - 1, signal.SIGTERM, target_pid=rank1.pid)
    rank1.wait(timeout=120)
    assert (rank0.returncode, rank1.returncode) == (contract.EXIT_RESUMABLE,) * 2, log
    assert final(ckpt)["position"]["global_step"] == DDP_STEPS_PER_EPOCH
    ranks = _srun_style_ranks(out, config, job_id, tmp_path / "rank1.log")
    log = ranks[0].communicate(timeout=300)[1]
    ranks[1].wait(timeout=60)
    assert [rank.returncode for rank in ranks] == [0, 0], log[-3000:] + (tmp_path / "rank1.log").read_text()
    reference_out, reference_ckpt, _ = torchrun_batchnorm_run
    pd.testing.assert_frame_equal(learning_columns(out), learning_columns(reference_out), check_exact=True)
    assert_same_weights(final(ckpt)["model"], final(reference_ckpt)["model"])
    ddp = summary_results(out)["ddp_options"]
    assert ddp["static_graph"] is True and ddp["batched_grad_copy"] is True
    assert ddp.get("forward_sync_buffers", ddp.get("broadcast_buffers")) is False
