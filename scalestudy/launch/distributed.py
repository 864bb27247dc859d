"""Who am I in the job: rank, local rank, world size and rendezvous address, and the process group.

Three ways to be started, checked in this order:

- torchrun (or any launcher that sets RANK and WORLD_SIZE): RANK, LOCAL_RANK, WORLD_SIZE,
  MASTER_ADDR, MASTER_PORT.
- srun with one task per GPU: SLURM_PROCID, SLURM_LOCALID, SLURM_STEP_NUM_TASKS (else SLURM_NTASKS);
  the master is the first host of SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST), the port is derived
  from the job and step id so that concurrent jobs sharing a node do not collide. MASTER_ADDR and
  MASTER_PORT, when set, win.
- anything else: a single process.

The environment parsing is pure (it takes a mapping) and imports no torch, so that the launcher and
the tests can use it; torch is imported only by the functions that need it.
"""

from __future__ import annotations

import ctypes
import datetime
import os
import re
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scalestudy.launch.launcher import LAUNCHER_PID_ENV  # stdlib only, like this module
from scalestudy.plan import schema

NCCL_ASYNC_ERROR_HANDLING = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
DEFAULT_MASTER_ADDR = "127.0.0.1"
DEFAULT_MASTER_PORT = 29500
# Ports below Linux's ephemeral range (32768-60999), so a derived port is not taken by a client socket.
SLURM_PORT_BASE = 20000
SLURM_PORT_SPAN = 10000


@dataclass(frozen=True)
class DistEnv:
    rank: int
    local_rank: int
    world_size: int
    master_addr: str
    master_port: int
    launcher: str  # "torchrun", "srun" or "single"

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def expand_hostlist(spec: str) -> list[str]:
    """Expand a Slurm host list: "n[1-3,5],gpu07" -> n1 n2 n3 n5 gpu07; "a[01-02]-ib" keeps padding."""
    hosts: list[str] = []
    for item in _split_top_level(spec):
        hosts.extend(_expand_item(item, spec))
    if not hosts:
        raise ValueError(f"empty Slurm host list {spec!r}")
    return hosts


def _split_top_level(spec: str) -> list[str]:
    items, depth, current = [], 0, []
    for char in spec.strip():
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth not in (0, 1):
            raise ValueError(f"unbalanced brackets in Slurm host list {spec!r}")
        if char == "," and depth == 0:
            items.append("".join(current))
            current = []
        else:
            current.append(char)
    if depth:
        raise ValueError(f"unbalanced brackets in Slurm host list {spec!r}")
    items.append("".join(current))
    return [item for item in items if item]


def _expand_item(item: str, spec: str) -> list[str]:
    match = re.search(r"\[([^\]]*)\]", item)
    if match is None:
        return [item]
    head, tail = item[: match.start()], item[match.end() :]
    tails = _expand_item(tail, spec)
    return [head + number + rest for number in _expand_ranges(match.group(1), spec) for rest in tails]


def _expand_ranges(ranges: str, spec: str) -> list[str]:
    numbers = []
    for part in ranges.split(","):
        low, _, high = part.partition("-")
        high = high or low
        if not (low.isdigit() and high.isdigit()) or int(low) > int(high):
            raise ValueError(f"bad range {part!r} in Slurm host list {spec!r}")
        numbers.extend(str(n).zfill(len(low)) for n in range(int(low), int(high) + 1))
    return numbers


def slurm_port(job_id: str, step_id: str | None = None) -> int:
    """A rendezvous port from the job (and step) id: jobs less than 1,000 ids apart never collide."""
    job, step = _parse_int("SLURM_JOB_ID", job_id), _parse_int("SLURM_STEP_ID", step_id or "0")
    return SLURM_PORT_BASE + (job * 10 + step % 10) % SLURM_PORT_SPAN


def from_environ(env: Mapping[str, str] | None = None) -> DistEnv:
    env = os.environ if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env:
        found = DistEnv(
            rank=_int(env, "RANK"),
            local_rank=_int(env, "LOCAL_RANK", 0),
            world_size=_int(env, "WORLD_SIZE"),
            master_addr=env.get("MASTER_ADDR", DEFAULT_MASTER_ADDR),
            master_port=_int(env, "MASTER_PORT", DEFAULT_MASTER_PORT),
            launcher="torchrun",
        )
    elif "SLURM_PROCID" in env and ("SLURM_STEP_NUM_TASKS" in env or "SLURM_NTASKS" in env):
        found = _from_slurm(env)
    else:
        found = DistEnv(0, 0, 1, DEFAULT_MASTER_ADDR, DEFAULT_MASTER_PORT, "single")
    if not 0 <= found.rank < found.world_size or found.local_rank < 0:
        raise ValueError(
            f"inconsistent {found.launcher} environment: rank={found.rank}, local_rank={found.local_rank}, "
            f"world_size={found.world_size}"
        )
    return found


def _from_slurm(env: Mapping[str, str]) -> DistEnv:
    tasks_key = "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in env else "SLURM_NTASKS"
    nodelist_key = next(
        (key for key in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST") if env.get(key)), None
    )
    if env.get("MASTER_ADDR"):
        master_addr = env["MASTER_ADDR"]
    elif nodelist_key:
        master_addr = expand_hostlist(env[nodelist_key])[0]
    else:
        raise ValueError("srun environment without SLURM_STEP_NODELIST/SLURM_JOB_NODELIST or MASTER_ADDR")
    if env.get("MASTER_PORT"):
        master_port = _int(env, "MASTER_PORT")
    elif env.get("SLURM_JOB_ID"):
        master_port = slurm_port(env["SLURM_JOB_ID"], env.get("SLURM_STEP_ID"))
    else:
        master_port = DEFAULT_MASTER_PORT
    return DistEnv(
        rank=_int(env, "SLURM_PROCID"),
        local_rank=_int(env, "SLURM_LOCALID", 0),
        world_size=_int(env, tasks_key),
        master_addr=master_addr,
        master_port=master_port,
        launcher="srun",
    )


def _int(env: Mapping[str, str], key: str, default: int | None = None) -> int:
    if key not in env:
        if default is None:
            raise ValueError(f"environment variable {key} is not set")
        return default
    return _parse_int(key, env[key])


def _parse_int(key: str, value: str) -> int:
    if not re.fullmatch(r"\d+", value.strip()):  # int() would also take "1_0" and "-1"
        raise ValueError(f"environment variable {key}={value!r} is not a non-negative integer")
    return int(value)


# --- dying with the launcher ----------------------------------------------------------------

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(launcher_pid: int | None = None) -> bool:
    """Have the kernel SIGKILL this process when its parent exits (Linux PR_SET_PDEATHSIG).

    For the ranks torchrun starts: if the agent is killed (SIGKILL gives it no chance to stop its
    workers) they must not train on and write the run folder. The signal fires when the parent
    *thread* that started this process ends; torchrun's agent starts its workers from its main
    thread (torch.distributed.elastic's SubprocessContext, Popen), which ends only with the agent.
    `launcher_pid`, the agent's pid: if it died before the call, the call cannot notice, so it is
    checked after it. False where prctl is unavailable (not Linux).
    """
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return False
    if prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return False
    if launcher_pid and os.getppid() != launcher_pid and not process_running(launcher_pid):
        print(f"launcher (pid {launcher_pid}) is gone: this rank ends too", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    return True


def die_with_launcher(env: Mapping[str, str] | None = None) -> bool:
    """die_with_parent for a rank that torchrun started (TORCHELASTIC_RUN_ID set), else nothing."""
    env = os.environ if env is None else env
    if "TORCHELASTIC_RUN_ID" not in env:
        return False
    value = env.get(LAUNCHER_PID_ENV, "")
    return die_with_parent(int(value) if value.isdigit() else None)


def process_running(pid: int) -> bool:
    """True while `pid` exists and is not a zombie (a killed process its parent has not reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True


# --- torch side -------------------------------------------------------------------------------


def select_device(device: str, local_rank: int):
    """The rank's device: with "auto", the GPU of its local rank (or the only visible one), else the CPU."""
    import torch

    allowed = schema.rule_of(schema.node("train", "device"))
    if not allowed.accepts(device):
        raise ValueError(f"run config device must be {allowed.describe()}, got device={device!r}")
    if device == "cpu" or (device == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ValueError("run config device='cuda' but torch sees no CUDA device")
    count = torch.cuda.device_count()
    # With --gpus-per-task=1 Slurm hides the other GPUs: each task sees its one GPU as cuda:0.
    index = 0 if count == 1 else local_rank
    if index >= count:
        raise ValueError(f"local rank {local_rank} has no GPU: this node shows {count} GPUs")
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def select_backend(backend: str, device) -> str:
    if backend == "auto":
        return "nccl" if device.type == "cuda" else "gloo"
    if backend not in ("nccl", "gloo"):
        raise ValueError(f"run config backend must be auto, nccl or gloo, got backend={backend!r}")
    if backend == "nccl" and device.type != "cuda":
        raise ValueError(f"run config backend='nccl' needs CUDA devices, this rank runs on {device}")
    return backend


def init_process_group(dist_env: DistEnv, backend: str, timeout_s: float, device=None):
    """Join the job's process group; returns a separate gloo group for small CPU-side agreements
    (with the same timeout).

    NCCL's async error handling makes a collective that exceeds `timeout_s` abort the process
    instead of hanging forever, so a lost rank fails the job (and Slurm/Snakemake can retry it).
    """
    import torch.distributed as dist

    os.environ.setdefault(NCCL_ASYNC_ERROR_HANDLING, "1")
    rendezvous = {"MASTER_ADDR": dist_env.master_addr, "MASTER_PORT": str(dist_env.master_port)}
    # Set for env:// only while joining: left in os.environ they would reach every process this one
    # starts later (a test run's Snakemake, a Slurm job) and point it at this rendezvous.
    saved = {key: os.environ.get(key) for key in rendezvous}
    os.environ.update(rendezvous)
    try:
        dist.init_process_group(
            backend=backend,
            init_method="env://",  # under torchrun this joins the agent's store instead of opening the port
            rank=dist_env.rank,
            world_size=dist_env.world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
            device_id=device if backend == "nccl" else None,
        )
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    # the control group's collectives (the stop agreement) fail after timeout_s too, not torch's 30 min
    return dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))


def is_initialized() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def all_reduce_sum(tensor, group=None, async_op: bool = False):
    """Sum `tensor` over ranks in place (no-op in a single process); returns it, or with
    async_op the work handle to wait() on before reading it."""
    if not is_initialized():
        return tensor
    import torch.distributed as dist

    work = dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group, async_op=async_op)
    return work if async_op else tensor


def all_gather_object(obj: Any, group=None) -> list[Any]:
    """Every rank's `obj` on every rank, in rank order; `group`: a gloo group (the trainer's control
    group) keeps the pickles off the device, default: the process group's backend."""
    if not is_initialized():
        return [obj]
    import torch.distributed as dist

    gathered: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, obj, group=group)
    return gathered


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank `src`'s `obj` on every rank (pickled; fine for a checkpoint's few hundred MB)."""
    if not is_initialized():
        return obj
    import torch.distributed as dist

    holder = [obj]
    dist.broadcast_object_list(holder, src=src)
    return holder[0]


def gather_object(obj: Any, dst: int = 0) -> list[Any] | None:
    """Every rank's `obj` on rank `dst` (a list there, None elsewhere)."""
    if not is_initialized():
        return [obj]
    import torch.distributed as dist

    gathered: list[Any] | None = [None] * dist.get_world_size() if dist.get_rank() == dst else None
    dist.gather_object(obj, gathered, dst=dst)
    return gathered


def barrier() -> None:
    if is_initialized():
        import torch.distributed as dist

        dist.barrier()


def destroy_process_group() -> None:
    if is_initialized():
        import torch.distributed as dist

        dist.destroy_process_group()
