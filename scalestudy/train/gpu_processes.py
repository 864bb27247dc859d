"""What else runs on a job's GPUs and CPUs, for the GPU monitor (scalestudy.train.gpu_monitor): the
compute processes NVML lists on a GPU, which of them are not the job's, and the host's load.

Whose process. The job's own processes on a host are its ranks there (their PIDs, gathered once at
setup: the trainer's rank records, job_on_host), their descendants (a compile worker, the command
workload's script) and their ancestors (torchrun's agent, the launcher, the benchmark that spawned
the trainer and waits for it, Snakemake): the job's process tree. Every other process NVML lists on
the GPU is foreign: another job on a shared node, a second Snakemake's job (a sibling under the same
Snakemake is not an ancestor: foreign), an MPS client of another user, a notebook. The MPS control
daemon's server (nvidia-cuda-mps-server) is listed on every GPU it serves but runs no work itself:
it is left out. (An ancestor that computes on the GPU while the job measures is not caught; the
project's own, the benchmark, starts no CUDA in its process while a trainer runs.)

PID namespaces. NVML reports PIDs of the host's namespace; inside a container with its own PID
namespace the job's PIDs are other numbers. When processes are listed but none of them is one of
the job's, PIDs are not comparable: the processes beyond the job's expected count on that GPU (its
ranks that use it, normally one) are counted as foreign, their memory is not known (left empty),
and the report says so for that GPU (`pid_namespace_samples`).

The query: nvmlDeviceGetComputeRunningProcesses (the v3 struct in nvidia-ml-py 12 and later), else
its _v3 and _v2 forms, the first one that nvidia-ml-py and the driver offer (an older driver lacks a
symbol: NVML_ERROR_FUNCTION_NOT_FOUND; a vGPU guest answers NOT_SUPPORTED), and, where it exists,
nvmlDeviceGetMPSComputeRunningProcesses for MPS clients. With none, the process columns stay empty
and the report says why: never a zero.

Cost: one NVML call per GPU and sample (two with MPS) on the monitor's thread, never in the training
step; /proc is read once per PID not seen before, and the ranks' ancestors once.
"""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

COMPUTE_QUERIES = (
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetComputeRunningProcesses_v2",
)
MPS_QUERIES = (
    "nvmlDeviceGetMPSComputeRunningProcesses",
    "nvmlDeviceGetMPSComputeRunningProcesses_v3",
    "nvmlDeviceGetMPSComputeRunningProcesses_v2",
)
ABSENT_CODES = (3, 13)  # NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND: try the next form
MPS_SERVER = "nvidia-cuda-mps-server"
ANCESTRY_DEPTH = 64


def uuid_key(uuid: str) -> str:
    """NVML's "GPU-xxxxxxxx-..." and torch's "xxxxxxxx-..." as one comparable form."""
    text = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
    text = text.strip().lower()
    return text[len("gpu-") :] if text.startswith("gpu-") else text


@dataclass(frozen=True)
class JobProcesses:
    """The job on one host: its ranks' PIDs, and how many of its ranks use each GPU (by uuid_key),
    what NVML lists there when PIDs cannot be compared (1 for a GPU not named)."""

    pids: frozenset[int]
    ranks_per_gpu: Mapping[str, int] = field(default_factory=dict)

    def expected_on(self, uuid: str) -> int:
        return self.ranks_per_gpu.get(uuid_key(uuid), 1)


def this_process() -> JobProcesses:
    return JobProcesses(frozenset({os.getpid()}))


def job_on_host(ranks: Iterable[Mapping[str, Any]], host: str) -> JobProcesses:
    """The job's processes on `host` from every rank's record ({host, pid, gpu_uuid})."""
    mine = [rank for rank in ranks if rank.get("host") == host]
    pids = frozenset(int(rank["pid"]) for rank in mine if rank.get("pid"))
    counts = Counter(uuid_key(rank["gpu_uuid"]) for rank in mine if rank.get("gpu_uuid"))
    return JobProcesses(pids or this_process().pids, dict(counts))


def host_load() -> tuple[float | None, int | None]:
    """The host's 1-minute load average and its CPU count (None where the system does not say)."""
    try:
        load = os.getloadavg()[0]
    except (OSError, AttributeError):
        load = None
    return load, os.cpu_count()


def job_cpus() -> list[int] | None:
    """The CPUs this process may run on (its affinity: a Slurm job's cores), None where unknown."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (OSError, AttributeError):
        return None


class ProcessQuery:
    """The first form of a process query (`names`) that nvml and the driver answer. Calling it
    returns {pid: used bytes or None}, or None once every form has failed (`reason` says why); an
    NVML error of another kind (transient) is raised to the caller."""

    def __init__(self, nvml, names: tuple[str, ...]):
        self.nvml, self.names = nvml, list(names)
        self.name: str | None = None
        self.failures: list[str] = []

    @property
    def reason(self) -> str | None:
        if self.name or self.names:
            return None
        return "; ".join(self.failures) or "no process query"

    def __call__(self, handle) -> dict[int, int | None] | None:
        while self.name is None and self.names:
            name = self.names[0]
            try:
                listed = self._ask(name, handle)
            except AttributeError:
                self.failures.append(f"{name}: not in this nvidia-ml-py")
            except self.nvml.NVMLError as error:
                if getattr(error, "value", None) not in ABSENT_CODES:
                    raise
                self.failures.append(f"{name}: {error}")
            else:
                self.name = name
                return listed
            self.names.pop(0)
        return self._ask(self.name, handle) if self.name else None

    def _ask(self, name: str, handle) -> dict[int, int | None]:
        processes = getattr(self.nvml, name)(handle)
        return {int(p.pid): getattr(p, "usedGpuMemory", None) for p in processes}


@dataclass
class Span:
    """A process seen on a GPU in consecutive samples."""

    pid: int
    first_s: float
    last_s: float
    samples: int = 1
    max_mem_mb: float | None = None
    identified: bool = True  # False: PIDs were not comparable (a PID namespace), so maybe the job's

    def record(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "first_s": self.first_s,
            "last_s": self.last_s,
            "samples": self.samples,
            "max_mem_mb": self.max_mem_mb,
            "identified": self.identified,
        }


class Processes:
    """One monitor's process watch: the queries, the job, and who each listed PID is."""

    def __init__(self, nvml, job: JobProcesses | None = None, proc: Path = Path("/proc")):
        self.job = job or this_process()
        self.compute = ProcessQuery(nvml, COMPUTE_QUERIES)
        self.mps = ProcessQuery(nvml, MPS_QUERIES)
        self.proc = proc
        self._own: dict[int, bool] = {}
        self._ancestors: frozenset[int] | None = None

    @property
    def reason(self) -> str | None:
        """Why no process is listed (no query answers), else None."""
        return self.compute.reason

    def listed(self, handle) -> dict[int, int | None] | None:
        """{pid: used bytes or None} of every compute and MPS process on the GPU; None: no query."""
        found = self.compute(handle)
        if found is None:
            return None
        with contextlib.suppress(Exception):  # MPS clients are an extra: their query failing changes nothing
            found.update({pid: used for pid, used in (self.mps(handle) or {}).items() if pid not in found})
        return found

    def foreign(self, listed: Mapping[int, int | None], uuid: str) -> tuple[dict[int, int | None], bool]:
        """({pid: used bytes} of the processes that are not the job's, PIDs comparable). Not comparable
        (none listed is the job's rank or their ancestor): every listed process, and the count beyond
        the job's is foreign."""
        if listed and not any(pid in self.job.pids or pid in self.ancestors() for pid in listed):
            return dict(listed), False
        return {pid: used for pid, used in listed.items() if not self.is_own(pid)}, True

    def is_own(self, pid: int) -> bool:
        """The job's rank, a descendant or an ancestor of one, or the MPS server; read from /proc
        once per PID."""
        if pid in self.job.pids or pid in self.ancestors():
            return True
        if pid not in self._own:
            self._own[pid] = self._name(pid) == MPS_SERVER or self._descends_from_job(pid)
        return self._own[pid]

    def ancestors(self) -> frozenset[int]:
        """The parents, grandparents, ... of the job's ranks on this host, read once (pid 0 not)."""
        if self._ancestors is None:
            found: set[int] = set()
            for pid in self.job.pids:
                found.update(self._lineage(pid))
            self._ancestors = frozenset(found - self.job.pids)
        return self._ancestors

    def _name(self, pid: int) -> str | None:
        try:
            return (self.proc / str(pid) / "comm").read_text().strip()
        except OSError:
            return None

    def _descends_from_job(self, pid: int) -> bool:
        return any(parent in self.job.pids for parent in self._lineage(pid))

    def _lineage(self, pid: int) -> list[int]:
        """`pid`'s parent, its parent, ... up to init (1), as far as /proc says."""
        parents: list[int] = []
        for _ in range(ANCESTRY_DEPTH):
            try:
                stat = (self.proc / str(pid) / "stat").read_text()
                pid = int(stat.rsplit(")", 1)[1].split()[1])  # the field after the state: ppid
            except (OSError, IndexError, ValueError):
                break
            if pid < 1:
                break
            parents.append(pid)
            if pid == 1:
                break
        return parents


class GpuWatch:
    """One GPU's processes over the run: per sample the row values, and the foreign processes'
    spans for the report (the analysis names the PIDs whose span meets the measurement window)."""

    def __init__(self, uuid: str, expected: int):
        self.uuid, self.expected = uuid, expected
        self.spans: list[Span] = []
        self.open: dict[int, Span] = {}
        self.namespace_samples = 0

    def observe(self, now: float, listed: int, foreign: Mapping[int, int | None], comparable: bool) -> tuple:
        """(processes, foreign_processes, foreign_mem_mb) of one sample: `listed` processes, of which
        `foreign` (Processes.foreign: every listed one where PIDs are not comparable)."""
        self._track(now, foreign, comparable)
        if comparable:
            known = [used for used in foreign.values() if used is not None]
            memory = sum(known) / 1e6 if known or not foreign else None
            return listed, len(foreign), memory
        self.namespace_samples += 1
        return listed, max(0, listed - self.expected), None

    def _track(self, now: float, foreign: Mapping[int, int | None], comparable: bool) -> None:
        for pid in [pid for pid in self.open if pid not in foreign]:
            self.spans.append(self.open.pop(pid))
        for pid, used in foreign.items():
            mem = None if used is None else used / 1e6
            span = self.open.get(pid)
            if span is None or span.identified != comparable:
                if span is not None:
                    self.spans.append(span)
                self.open[pid] = Span(pid, now, now, 1, mem, comparable)
                continue
            span.last_s, span.samples = now, span.samples + 1
            if mem is not None:
                span.max_mem_mb = max(mem, span.max_mem_mb or 0.0)

    def report(self) -> dict[str, Any]:
        spans = sorted([*self.spans, *self.open.values()], key=lambda span: (span.first_s, span.pid))
        return {
            "expected_own": self.expected,
            "pid_namespace_samples": self.namespace_samples,
            "foreign": [span.record() for span in spans],
        }
