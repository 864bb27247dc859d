"""Rank, world and rendezvous from torchrun / srun variables; Slurm host lists; the process group."""

import multiprocessing
import os
import queue
import re
import socket
import time

import pytest
import torch

from scalestudy.launch import distributed
from scalestudy.launch.distributed import DistEnv, expand_hostlist, from_environ, slurm_port


@pytest.mark.parametrize(
    ("spec", "hosts"),
    [
        ("localhost", ["localhost"]),
        ("n1,n2", ["n1", "n2"]),
        ("n[1-3,5],gpu07", ["n1", "n2", "n3", "n5", "gpu07"]),
        ("node[008-011]", ["node008", "node009", "node010", "node011"]),
        ("gpu[1-2]-ib", ["gpu1-ib", "gpu2-ib"]),
        ("r[1-2]n[07-08]", ["r1n07", "r1n08", "r2n07", "r2n08"]),
        ("a[9-10],b[3]", ["a9", "a10", "b3"]),
    ],
)
def test_expand_hostlist(spec, hosts):
    assert expand_hostlist(spec) == hosts


@pytest.mark.parametrize("spec", ["n[1-3", "n1-3]", "n[3-1]", "n[a-b]", "n[[1]]", ""])
def test_expand_hostlist_rejects_malformed_lists(spec):
    with pytest.raises(ValueError, match="host list"):
        expand_hostlist(spec)


def test_torchrun_variables():
    env = {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "n1", "MASTER_PORT": "29400"}
    assert from_environ(env) == DistEnv(3, 1, 4, "n1", 29400, "torchrun")


def test_torchrun_wins_over_slurm_variables():
    """torchrun inside an sbatch job: the Slurm variables describe the job, not the ranks."""
    env = {
        "RANK": "1",
        "WORLD_SIZE": "2",
        "SLURM_PROCID": "0",
        "SLURM_NTASKS": "1",
        "SLURM_JOB_NODELIST": "x",
    }
    found = from_environ(env)
    assert (found.rank, found.world_size, found.launcher) == (1, 2, "torchrun")


SRUN = {
    "SLURM_PROCID": "5",
    "SLURM_LOCALID": "1",
    "SLURM_NTASKS": "8",
    "SLURM_JOB_NODELIST": "gpu[03-06]",
    "SLURM_JOB_ID": "123456",
}


def test_srun_variables_give_rank_world_and_master():
    found = from_environ(SRUN)
    assert (found.rank, found.local_rank, found.world_size) == (5, 1, 8)
    assert found.master_addr == "gpu03"
    assert found.master_port == slurm_port("123456")
    assert found.launcher == "srun"


def test_srun_step_variables_win_over_job_variables():
    env = {**SRUN, "SLURM_STEP_NUM_TASKS": "6", "SLURM_STEP_NODELIST": "gpu[05-06]", "SLURM_STEP_ID": "2"}
    found = from_environ(env)
    assert (found.world_size, found.master_addr, found.master_port) == (6, "gpu05", slurm_port("123456", "2"))


def test_master_addr_and_port_override_under_srun():
    found = from_environ({**SRUN, "MASTER_ADDR": "10.0.0.7", "MASTER_PORT": "23456"})
    assert (found.master_addr, found.master_port) == ("10.0.0.7", 23456)


def test_no_launcher_means_one_process():
    found = from_environ({"PATH": "/usr/bin"})
    assert (found.rank, found.local_rank, found.world_size, found.launcher) == (0, 0, 1, "single")


def test_slurm_ports_differ_between_nearby_jobs_and_steps_and_stay_in_range():
    ports = {slurm_port(str(job), str(step)) for job in range(777000, 777900) for step in range(3)}
    assert len(ports) == 900 * 3
    assert all(
        distributed.SLURM_PORT_BASE <= p < distributed.SLURM_PORT_BASE + distributed.SLURM_PORT_SPAN
        for p in ports
    )


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x'"),
        ({"RANK": "2", "WORLD_SIZE": "2"}, "rank=2"),
        ({**SRUN, "SLURM_NTASKS": "4"}, "rank=5"),
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2"}, "NODELIST"),
        ({**SRUN, "SLURM_JOB_ID": "12_3"}, "SLURM_JOB_ID='12_3'"),
    ],
)
def test_bad_environments_name_the_variable(env, message):
    with pytest.raises(ValueError, match=message):
        from_environ(env)


def test_backend_and_device_choice():
    cpu = torch.device("cpu")
    assert distributed.select_backend("auto", cpu) == "gloo"
    assert distributed.select_backend("auto", torch.device("cuda", 0)) == "nccl"
    with pytest.raises(ValueError, match="backend='nccl'"):
        distributed.select_backend("nccl", cpu)
    with pytest.raises(ValueError, match="backend='mpi'"):
        distributed.select_backend("mpi", cpu)
    assert distributed.select_device("cpu", local_rank=3) == cpu
    with pytest.raises(ValueError, match="device='tpu'"):
        distributed.select_device("tpu", 0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU answer")
def test_auto_device_without_gpu_is_cpu_and_cuda_is_refused():
    assert distributed.select_device("auto", 0) == torch.device("cpu")
    with pytest.raises(ValueError, match="device='cuda'"):
        distributed.select_device("cuda", 0)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_process_group_of_one(monkeypatch):
    monkeypatch.delenv(distributed.NCCL_ASYNC_ERROR_HANDLING, raising=False)
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.setenv("MASTER_PORT", "1")
    dist_env = DistEnv(0, 0, 1, "127.0.0.1", _free_port(), "single")
    try:
        control = distributed.init_process_group(dist_env, "gloo", 30)
        assert distributed.all_reduce_sum(torch.tensor([3]), control).item() == 3
        assert os.environ[distributed.NCCL_ASYNC_ERROR_HANDLING] == "1"
        # The rendezvous address is not left behind for the processes this one starts later.
        assert "MASTER_ADDR" not in os.environ and os.environ["MASTER_PORT"] == "1"
        assert distributed.all_reduce_sum(torch.tensor([2.0])).item() == 2.0
        assert distributed.all_gather_object({"a": 1}) == [{"a": 1}]
        assert distributed.broadcast_object("x") == "x"
        assert distributed.gather_object(7) == [7]
    finally:
        distributed.destroy_process_group()
    assert not distributed.is_initialized()


def test_missing_rank_fails_after_the_configured_timeout():
    """A rank that never arrives makes rank 0 fail after pg_timeout_s instead of waiting forever."""
    dist_env = DistEnv(0, 0, 2, "127.0.0.1", _free_port(), "single")
    start = time.monotonic()
    with pytest.raises(Exception, match="(?i)timeout|timed out"):
        distributed.init_process_group(dist_env, "gloo", timeout_s=2)
    distributed.destroy_process_group()
    assert time.monotonic() - start < 30


def _rank(rank: int, port: int, answers) -> None:
    """Rank 1 joins the group, then takes part in no collective (a rank lost to a hang); rank 0
    runs a collective on the control group and reports how it ended, and after how long. A rank
    that cannot even join within the 3 s (a loaded machine) says so, and the test tries again."""
    torch.set_num_threads(1)
    try:
        control = distributed.init_process_group(
            DistEnv(rank, rank, 2, "127.0.0.1", port, "single"), "gloo", 3
        )
    except Exception as error:  # noqa: BLE001 - reported, the parent retries
        _answer(answers, ("not joined", 0.0, str(error)))
    if rank == 1:
        time.sleep(120)
    start = time.monotonic()
    try:
        distributed.all_reduce_sum(torch.tensor([1]), control)
        _answer(answers, ("returned", time.monotonic() - start, ""))
    except Exception as error:  # noqa: BLE001 - the test reads what it was
        _answer(answers, ("raised", time.monotonic() - start, str(error)))


def _answer(answers, outcome: tuple[str, float, str]) -> None:
    """Put `outcome` and end the process once it is in the pipe: a Queue's feeder thread writes it
    in the background, and os._exit right after put() can lose it (the parent then waits 60 s)."""
    answers.put(outcome)
    answers.close()
    answers.join_thread()
    os._exit(0)


def _control_group_outcome(context) -> tuple[str, float, str]:
    """The first report of one 2-rank attempt (see _rank)."""
    answers, port = context.Queue(), _free_port()
    ranks = [context.Process(target=_rank, args=(rank, port, answers), daemon=True) for rank in (0, 1)]
    for process in ranks:
        process.start()
    try:
        return answers.get(timeout=60)
    except queue.Empty:
        pytest.fail("the control group's all-reduce did not time out within 60 s")
    finally:
        for process in ranks:
            process.kill()
            process.join()


def test_the_control_group_also_fails_after_the_configured_timeout():
    """The stop agreement's gloo group has pg_timeout_s (3 s here), not torch's 30-minute default."""
    # spawn, not fork: a fork of the test process (its torch and gloo threads) can hang in the child
    context = multiprocessing.get_context("spawn")
    for _ in range(3):
        outcome, seconds, message = _control_group_outcome(context)
        if outcome != "not joined":
            break
    assert outcome == "raised" and re.search("(?i)timeout|timed out", message), (outcome, message)
    assert seconds < 20
