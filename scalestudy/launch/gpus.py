"""The GPUs of this machine as a job's own, outside Slurm: which GPUs the machine offers, and N of
them held by a job until its last process ends.

- `offered(environ)`: NVML's devices (index, UUID), restricted to CUDA_VISIBLE_DEVICES when it is
  set (indices or UUIDs, read as CUDA does: an entry that names no GPU ends the list); none where
  NVML or the driver is missing.
- `acquire(gpus, count, folder)`: `count` of them, all or nothing, each by an exclusive flock on
  its lock file `<folder>/<UUID>.lock`. A GPU whose lock another process holds is busy; with fewer
  than `count` free, every lock taken is given back and the attempt repeats after a short sleep
  (never hold and wait: two jobs that each hold half of what they need cannot deadlock), with a
  progress line every PROGRESS_EVERY_S naming the busy GPUs and their holders.
- The lock descriptors stay open and inheritable: the launcher execs the ranks (or torchrun, or a
  profiler), so the kernel releases the locks when that process ends, however it ends (SIGKILL
  included). torchrun's ranks die with their agent (scalestudy.launch.distributed.die_with_parent).
- `assign(spec, launcher, environ)`: a launch's GPUs and the ranks' environment (SOURCE_ENV says
  who gave them): `local-lock` (here, the locks above), `slurm` (inside a Slurm allocation, or
  started by srun: Slurm binds the GPUs, no locks), `none` (CPU ranks; outside Slurm the machine's
  GPUs are hidden from them).

The lock folder is machine-wide (LOCK_DIR_ENV, default DEFAULT_LOCK_DIR), world-writable and
sticky like /tmp, so that two Snakemake invocations, of one user or two, never share a GPU. It must
be on a local file system. docs/guide/gpu.md tells the story for users. Standard library only (the
Snakefile imports this module); pynvml is imported when NVML is asked.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import fcntl
import json
import os
import socket
import stat
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LOCK_DIR_ENV = "SCALESTUDY_GPU_LOCK_DIR"
DEFAULT_LOCK_DIR = "/tmp/scalestudy-gpu-locks"
# What a GPU job's ranks get (docs/reference/cli.md, the launch spec; read by the monitor and provenance).
UUIDS_ENV = "SCALESTUDY_GPU_UUIDS"
SOURCE_ENV = "SCALESTUDY_GPU_SOURCE"
LOCAL_LOCK, SLURM, NONE = "local-lock", "slurm", "none"
VISIBLE_ENV = "CUDA_VISIBLE_DEVICES"
ORDER_ENV = "CUDA_DEVICE_ORDER"
PCI_BUS_ORDER = "PCI_BUS_ID"  # CUDA's numbering = NVML's (both by PCI bus id)

POLL_S = 1.0  # between two attempts to take the GPUs
PROGRESS_EVERY_S = 30.0  # a waiting launcher's progress line


class GpuError(ValueError):
    """A job that cannot get its GPUs here: the message names what it needs and what there is."""


@dataclass(frozen=True)
class Gpu:
    index: int  # NVML's index (PCI bus order)
    uuid: str  # NVML's "GPU-..."

    def __str__(self) -> str:
        return f"{self.uuid} (NVML {self.index})"


@dataclass(frozen=True)
class Offer:
    """The GPUs this machine offers a job, and where that came from (for log lines)."""

    gpus: tuple[Gpu, ...]
    note: str


# --------------------------------------------------------------------------- what the machine offers


def nvml_gpus(nvml: Any = None) -> tuple[list[Gpu], str]:
    """Every GPU NVML lists, and a note; ([], why) without NVML or a driver."""
    try:
        nvml = nvml or __import__("pynvml")
        nvml.nvmlInit()
    except Exception as error:  # noqa: BLE001 - no library, no driver: no GPU, said why
        return [], f"NVML unavailable: {type(error).__name__}: {error}"
    try:
        gpus, problems = [], []
        for index in range(nvml.nvmlDeviceGetCount()):
            try:
                uuid = nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(index))
            except nvml.NVMLError as error:  # e.g. a GPU another cgroup owns: not ours to give
                problems.append(f"NVML GPU {index} left out: {error}")
                continue
            gpus.append(Gpu(index, uuid.decode() if isinstance(uuid, bytes) else str(uuid)))
    except Exception as error:  # noqa: BLE001 - NVML that answers nothing offers nothing
        return [], f"NVML cannot list GPUs: {type(error).__name__}: {error}"
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()
    return gpus, "; ".join([f"NVML: {len(gpus)} GPU(s)", *problems])


def visible(gpus: Sequence[Gpu], setting: str | None) -> list[Gpu]:
    """The GPUs CUDA_VISIBLE_DEVICES=`setting` leaves (None: all). Entries are NVML indices or UUIDs
    ("GPU-...", a unique prefix is enough); as for CUDA, an entry that names no GPU ("-1", a MIG
    instance, a typo) ends the list."""
    if setting is None:
        return list(gpus)
    chosen: list[Gpu] = []
    for entry in setting.split(","):
        gpu = _named(gpus, entry.strip())
        if gpu is None:
            break
        if gpu not in chosen:
            chosen.append(gpu)
    return chosen


def _named(gpus: Sequence[Gpu], entry: str) -> Gpu | None:
    if entry.isdigit():
        return next((gpu for gpu in gpus if gpu.index == int(entry)), None)
    if entry.upper().startswith("GPU-"):
        matches = [gpu for gpu in gpus if gpu.uuid.lower().startswith(entry.lower())]
        return matches[0] if len(matches) == 1 else None
    return None


def offered(environ: Mapping[str, str] = os.environ, nvml: Any = None) -> Offer:
    """The GPUs this machine offers a job started with `environ`: NVML's, restricted to its
    CUDA_VISIBLE_DEVICES when that is set."""
    gpus, note = nvml_gpus(nvml)
    setting = environ.get(VISIBLE_ENV)
    if setting is None or not gpus:
        return Offer(tuple(gpus), note)
    kept = visible(gpus, setting)
    return Offer(tuple(kept), f"{note}; {VISIBLE_ENV}={setting!r} leaves {len(kept)}")


# --------------------------------------------------------------------------- the locks


def lock_folder(environ: Mapping[str, str] = os.environ) -> Path:
    """The machine-wide lock folder (LOCK_DIR_ENV, else DEFAULT_LOCK_DIR), created world-writable
    and sticky (like /tmp) when missing; GpuError when it is unusable."""
    folder = Path(environ.get(LOCK_DIR_ENV) or DEFAULT_LOCK_DIR)
    try:
        folder.mkdir(mode=0o1777, parents=True)
        os.chmod(folder, 0o1777)  # mkdir's mode is filtered by the umask
    except FileExistsError:
        pass
    except OSError as error:
        raise GpuError(f"cannot create the GPU lock folder {folder} ({error}); set {LOCK_DIR_ENV}") from None
    info = os.lstat(folder)
    if not stat.S_ISDIR(info.st_mode):
        raise GpuError(f"the GPU lock folder {folder} is not a folder (a link or a file); set {LOCK_DIR_ENV}")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise GpuError(
            f"the GPU lock folder {folder} is not writable by this user (its mode is "
            f"{stat.filemode(info.st_mode)}; it must be like /tmp's, drwxrwxrwt): ask its owner "
            f"(uid {info.st_uid}) to `chmod 1777` it, or set {LOCK_DIR_ENV}"
        )
    return folder


def lock_path(folder: Path, gpu: Gpu) -> Path:
    return folder / f"{gpu.uuid}.lock"


def _open_lock(path: Path) -> int:
    """The lock file's descriptor (created readable and writable by everyone; never through a link)."""
    flags = os.O_CREAT | os.O_NOFOLLOW
    try:
        fd = os.open(path, flags | os.O_RDWR, 0o666)
    except PermissionError:  # another user's file with a narrower mode: flock needs no write access
        return os.open(path, flags | os.O_RDONLY)
    with contextlib.suppress(OSError):
        if os.fstat(fd).st_uid == os.geteuid():
            os.fchmod(fd, 0o666)  # past the umask
    return fd


def _try_lock(path: Path) -> int | None:
    """The descriptor holding `path`'s exclusive lock, or None if another process holds it."""
    fd = _open_lock(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        os.close(fd)
        if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return None
        raise
    return fd


def _write_holder(fd: int, label: str | None) -> None:
    """Who holds the lock, for the progress lines of those who wait (best effort)."""
    holder = {
        "pid": os.getpid(),
        "uid": os.geteuid(),
        "host": socket.gethostname(),
        "since": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "job": label,
    }
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)


def holder(path: Path) -> str:
    """The holder a busy GPU's lock file names, in words."""
    try:
        record = json.loads(path.read_text())
        words = f"pid {record['pid']} on {record['host']} (uid {record['uid']}) since {record['since']}"
        return words + (f", {record['job']}" if record.get("job") else "")
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"


@dataclass
class Held:
    """GPUs held by this process: the open, inheritable lock descriptors (released when the last
    process that inherited them ends, or by release())."""

    gpus: tuple[Gpu, ...]
    fds: list[int] = field(default_factory=list, repr=False)

    def release(self) -> None:
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds.clear()


def try_acquire(
    gpus: Sequence[Gpu], count: int, folder: Path, label: str | None = None
) -> tuple[Held | None, list[Gpu]]:
    """(`count` of `gpus`, in their order, and []) or, when fewer are free, (None, the busy ones)
    holding nothing."""
    taken: list[tuple[Gpu, int]] = []
    busy: list[Gpu] = []
    for gpu in gpus:
        fd = _try_lock(lock_path(folder, gpu))
        if fd is None:
            busy.append(gpu)
        else:
            taken.append((gpu, fd))
        if len(taken) == count:
            break
    if len(taken) < count:
        Held((), [fd for _, fd in taken]).release()
        return None, busy
    for _, fd in taken:
        os.set_inheritable(fd, True)
        _write_holder(fd, label)
    return Held(tuple(gpu for gpu, _ in taken), [fd for _, fd in taken]), []


def acquire(
    gpus: Sequence[Gpu],
    count: int,
    folder: Path,
    label: str | None = None,
    *,
    poll_s: float = POLL_S,
    progress_every_s: float = PROGRESS_EVERY_S,
    say: Callable[[str], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Held:
    """`count` of `gpus`, waiting (holding none) until that many are free at once."""
    if count > len(gpus):
        raise GpuError(f"{count} GPU(s) asked for, {len(gpus)} offered")
    say = say or _say
    started, last_said = clock(), None
    while True:
        held, busy = try_acquire(gpus, count, folder, label)
        if held is not None:
            if last_said is not None:
                say(f"got {_names(held.gpus)} after waiting {clock() - started:.0f} s")
            return held
        now = clock()
        if last_said is None or now - last_said >= progress_every_s:
            holders = "; ".join(f"{gpu} held by {holder(lock_path(folder, gpu))}" for gpu in busy)
            waited = f"waiting {now - started:.0f} s so far"
            say(f"{waited} for {count} free GPU(s) of {len(gpus)}; busy: {holders}")
            last_said = now
        sleep(poll_s)


def _names(gpus: Sequence[Gpu]) -> str:
    return ", ".join(map(str, gpus))


def _say(message: str) -> None:
    print(f"launch: {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- a launch's GPUs


@dataclass
class Assignment:
    """The GPUs of one launch and who gave them (SOURCE_ENV); `held` keeps local-lock's locks."""

    source: str
    gpus: tuple[Gpu, ...] = ()
    hide: bool = False  # no GPU for these ranks: CUDA_VISIBLE_DEVICES="" (outside Slurm)
    held: Held | None = None

    def env(self) -> dict[str, str]:
        """The ranks' variables (every one set, so that none is inherited from a parent launch)."""
        env = {SOURCE_ENV: self.source, UUIDS_ENV: ",".join(gpu.uuid for gpu in self.gpus)}
        if self.source == LOCAL_LOCK:
            env[VISIBLE_ENV] = ",".join(str(gpu.index) for gpu in self.gpus)
            env[ORDER_ENV] = PCI_BUS_ORDER
        elif self.hide:
            env[VISIBLE_ENV] = ""
        return env

    def release(self) -> None:
        if self.held is not None:
            self.held.release()


def gpus_needed(spec: Mapping[str, Any]) -> int:
    """The GPUs a checked launch spec's ranks use on one machine: one per rank, or 0 (CPU ranks)."""
    return spec["world_size"] if spec["gpus_per_node"] and spec.get("device") != "cpu" else 0


def assign(
    spec: Mapping[str, Any],
    launcher: str,
    environ: Mapping[str, str] = os.environ,
    label: str | None = None,
    nvml: Any = None,
    say: Callable[[str], None] | None = None,
) -> Assignment:
    """The GPUs of a launch whose checked spec is `spec`, started by `launcher` (local or srun):
    held here until its last process ends (local-lock), Slurm's (slurm), or none (CPU ranks).
    GpuError where this machine has fewer GPUs than the ranks need."""
    in_slurm = bool(environ.get("SLURM_JOB_ID")) or launcher == "srun"
    needed = gpus_needed(spec)
    if needed == 0:
        return Assignment(NONE, hide=not in_slurm)
    if in_slurm:
        return Assignment(SLURM)
    say = say or _say
    offer = offered(environ, nvml)
    if not offer.gpus and spec["device"] == "auto":
        say(f"no GPU on this machine ({offer.note}): device auto, the ranks run on the CPU")
        return Assignment(NONE, hide=True)
    if needed > len(offer.gpus):
        raise GpuError(
            f"this job's {spec['world_size']} rank(s) need {needed} GPU(s), one each, but this machine "
            f"offers {len(offer.gpus)} ({offer.note}). Use world sizes of at most {len(offer.gpus)} "
            "here (scaling.world_sizes, sensitivity.world_size, profiling.world_sizes), or run the "
            "study under Slurm (docs/guide/gpu.md)"
        )
    folder = lock_folder(environ)
    held = acquire(offer.gpus, needed, folder, label, say=say)
    say(f"this job holds {_names(held.gpus)} ({LOCAL_LOCK} in {folder}; {offer.note})")
    return Assignment(LOCAL_LOCK, held.gpus, held=held)


def recorded(environ: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """What a rank's provenance says about its job's GPUs (the launcher's variables)."""
    uuids = environ.get(UUIDS_ENV)
    return {
        "source": environ.get(SOURCE_ENV),
        "uuids": [uuid for uuid in uuids.split(",") if uuid] if uuids is not None else None,
        "cuda_visible_devices": environ.get(VISIBLE_ENV),
    }
