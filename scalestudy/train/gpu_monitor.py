"""GPU sampling with NVML: every rank samples the GPU its torch device runs on, on a daemon thread.

Which GPU. NVML ignores CUDA_VISIBLE_DEVICES and numbers every GPU of the node, so a rank finds its
own GPU by UUID: `torch.cuda.get_device_properties(device).uuid` prints as 8-4-4-4-12 hex digits,
NVML's UUID is the same digits after "GPU-" (`device_uuid`). A rank on the CPU samples nothing and
says why. One sampler per rank (not one per node) keeps each thread's work fixed whatever the GPUs
per node: the two PCIe reads alone take ~20 ms each (NVML measures over a 20 ms window).

Gathering. At the end of the run every rank hands its report to rank 0 (gather_object), and rank 0
writes (write_outputs, scalestudy.train.gpu_monitor_files) one `gpu_monitor.csv` for the run,
sorted by time, host and GPU, plus `gpu_monitor.json` (available, reason, per node its sampled
GPUs with rank, power limit, GPM support and errors). Only rank 0 writes into the run folder; the
data are small (16 values per GPU per sample).

Columns and units (runfiles.MONITOR_COLUMNS); a value a GPU does not report is left empty:
- `time_s`: seconds since the run's t0 (rank 0's clock at setup), the base of summary.json's
  `measure_start_s`/`measure_end_s`, so the analysis can keep the samples of the measurement window.
- `sm_active_pct`: NVML GPM `NVML_GPM_METRIC_SM_UTIL`, the percentage of SMs busy (at least one warp
  resident), averaged over the time since the previous GPM value. GPM exists on Hopper and later
  (`nvmlGpmQueryDeviceSupport`); elsewhere the column is empty. NVML's GPM counters refresh every
  100 ms, so a GPM value spans at least GPM_MIN_INTERVAL_S: at a 100 ms sample period every second
  row carries one.
- `kernel_active_pct`: nvmlDeviceGetUtilizationRates().gpu, the percentage of time ONE OR MORE
  kernels ran over the driver's own window (1/6 s to 1 s by product). A single small kernel at a
  time reads 100 %: it says the GPU was never idle, not that its SMs were busy.
- `mem_util_pct`: ...().memory, time device memory was read or written (same window).
- `power_w` (NVML's mW / 1000), `power_limit_w` (nvmlDeviceGetEnforcedPowerLimit, the limit the
  board enforces now: 700 W on an H100 SXM, 350 W on an H100 PCIe, lower if capped),
  `power_fraction` = power_w / power_limit_w, comparable across SKUs.
- `pcie_rx_mb_s`, `pcie_tx_mb_s`: nvmlDeviceGetPcieThroughput in MB/s (10^6 bytes; NVML's KB/s
  / 1000), rx into the GPU, tx out of it, over a 20 ms window. They count ALL PCIe traffic of the
  GPU: host-device copies, peer-to-peer over PCIe, and GPUDirect RDMA between the GPU and the NIC
  (NCCL's inter-node traffic on InfiniBand/RoCE), so multi-node all-reduce shows up here too.
- `mem_used_mb` (10^6 bytes), `temperature_c`.
- `processes`: the compute processes NVML lists on the GPU (MPS clients included);
  `foreign_processes`: those not of the job's process tree (its ranks, their children and
  ancestors); `foreign_mem_mb`: their GPU memory (10^6 bytes). Which PIDs are the job's, PID
  namespaces and the query's fallbacks: scalestudy.train.gpu_processes. Each foreign PID's first
  and last sighting is in gpu_monitor.json (per GPU, `foreign`), so the analysis can name the PIDs
  seen inside the measurement window.
- `host_load_1m`: the host's 1-minute load average (os.getloadavg), `host_cpus`: its CPUs
  (os.cpu_count); the CPUs the rank may run on (its affinity) are in gpu_monitor.json per node.
- `energy_j`: joules the GPU used since the monitor's first reading, from NVML's total energy
  counter, read first at every sample; wraps and resets handled, empty on a GPU without the counter
  (scalestudy.train.energy_counter; gpu_monitor.json says why, per GPU and in `energy`).

Errors. Without NVML (no driver) or without a matching GPU the report says why and the run goes on.
An NVML error on one query leaves that value empty and is counted in the JSON; a device that is lost
(NVML_ERROR_GPU_IS_LOST) or whose read fails otherwise is reported and skipped from then on, and the
other devices of the monitor go on.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from scalestudy.plan import schema
from scalestudy.train.energy_counter import EnergyCounter, open_counter
from scalestudy.train.gpu_processes import (
    GpuWatch,
    JobProcesses,
    Processes,
    host_load,
    job_cpus,
    uuid_key,
)

log = logging.getLogger("scalestudy.monitor")

DEFAULT_INTERVAL_S = schema.node("train", "monitor_interval_s")["default"]
GPM_MIN_INTERVAL_S = 0.15  # NVML: two GPM samples must be more than 100 ms apart
OPEN_WAIT_S = 60.0  # the trainer waits this long at most for NVML to open (start(background=True))
POWER = 3  # power_w's place in _read's values


def device_uuid(device) -> str | None:
    """The NVML-style UUID of a torch CUDA device; None for any other device."""
    if str(device).split(":")[0] != "cuda":  # "cpu", torch.device("cpu"): no torch import needed
        return None
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return None
    return f"GPU-{torch.cuda.get_device_properties(device).uuid}"


def for_device(
    device,
    interval_s: float,
    t0: float | None = None,
    rank: int = 0,
    nvml=None,
    job: JobProcesses | None = None,
) -> GpuMonitor:
    """The monitor of one rank: its torch device's GPU, or a report saying why there is none. `job`:
    the job's processes on this host (gpu_processes.job_on_host); None: this process alone."""
    uuid = device_uuid(device)
    if uuid is None:
        return GpuMonitor(interval_s, t0=t0, rank=rank, no_gpu_reason=f"no NVIDIA GPU (device {device})")
    return GpuMonitor(interval_s, t0=t0, rank=rank, gpu_uuids=[uuid], nvml=nvml, job=job)


@dataclass
class Device:
    """One sampled GPU: what the report says about it, and its NVML state."""

    index: int
    uuid: str
    name: str
    rank: int
    handle: Any = None
    power_limit_w: float | None = None
    gpm_supported: bool = False
    gpm_reason: str | None = None
    failed: str | None = None
    errors: Counter = field(default_factory=Counter)
    last_error: dict = field(default_factory=dict)
    gpm_samples: list = field(default_factory=list)
    gpm_previous: Any = None
    gpm_previous_time: float = 0.0
    watch: GpuWatch | None = None  # its processes
    energy: EnergyCounter = field(default_factory=EnergyCounter)

    def report(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "uuid": self.uuid,
            "name": self.name,
            "rank": self.rank,
            "power_limit_w": self.power_limit_w,
            "gpm_supported": self.gpm_supported,
            "gpm_reason": self.gpm_reason,
            "failed": self.failed,
            "errors": {query: f"{self.last_error[query]} ({n}x)" for query, n in sorted(self.errors.items())},
            "processes": self.watch.report() if self.watch else None,
            "energy": self.energy.report(),
        }


class DeviceLost(Exception):
    pass


class GpuMonitor:
    """Samples the GPUs with the given UUIDs (all NVML shows if None) every `interval_s`.

    `t0` is the run's start (time.time() on rank 0), so time_s lines up across ranks and with the
    trainer's clock. `nvml` is the pynvml module (a test may pass a stand-in). `job`: the job's
    processes on this host, to tell foreign processes on the GPUs from its own (None: this process).
    """

    def __init__(
        self,
        interval_s: float = DEFAULT_INTERVAL_S,
        t0: float | None = None,
        host: str | None = None,
        rank: int = 0,
        gpu_uuids=None,
        nvml=None,
        no_gpu_reason: str | None = None,
        job: JobProcesses | None = None,
    ):
        if interval_s <= 0:
            raise ValueError(f"monitor_interval_s must be positive, got {interval_s}")
        self.interval_s = interval_s
        self.t0 = time.time() if t0 is None else t0
        self.host = host or socket.gethostname()
        self.rank = rank
        self.wanted = None if gpu_uuids is None else {uuid_key(u): u for u in gpu_uuids}
        self.nvml = nvml
        self.available = False
        self.reason = no_gpu_reason
        self.devices: list[Device] = []
        self.rows: list[tuple] = []
        self.job = job
        self.processes: Processes | None = None
        self.cpus = job_cpus()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._opened = threading.Event()  # set once NVML is open and sampled, or found unavailable

    def open(self) -> bool:
        """Initialise NVML and find the GPUs to sample (no thread yet); True if there is one."""
        if self.reason:
            log.info("GPU monitor off: %s", self.reason)
            return False
        try:
            self._init_nvml()
        except Exception as error:  # noqa: BLE001 - no NVML is a normal situation (CPU runs)
            self.reason = f"NVML unavailable on {self.host}: {type(error).__name__}: {error}"
            log.info("GPU monitor off: %s", self.reason)
            return False
        self.processes = Processes(self.nvml, self.job)
        self._open_devices()
        if not self.devices:
            self._shutdown_nvml()
            return False
        self.available = True
        log.info(
            "GPU monitor: rank %d samples %s every %.3f s",
            self.rank,
            ", ".join(
                f"{d.uuid} (NVML {d.index}, GPM {'on' if d.gpm_supported else 'off'})" for d in self.devices
            ),
            self.interval_s,
        )
        return True

    def start(self, background: bool = False) -> GpuMonitor:
        """Open NVML and sample on a daemon thread. background: open NVML on that thread too, so the
        caller goes on at once (the trainer loads its data and model meanwhile; NVML's start is
        off its start-up's critical path); `wait_open` waits for it."""
        if background:
            self._thread = threading.Thread(target=self._open_and_run, name="gpu-monitor", daemon=True)
            self._thread.start()
        elif self.open():
            self._thread = threading.Thread(target=self._run, name="gpu-monitor", daemon=True)
            self._thread.start()
        else:
            self._opened.set()
        return self

    def wait_open(self, timeout_s: float | None = None) -> bool:
        """Wait until NVML is open (or found unavailable) and the first sample is taken; True if
        it is (False: still opening after timeout_s)."""
        return self._opened.wait(timeout_s)

    def _open_and_run(self) -> None:
        try:
            opened = self.open()
        except Exception as error:  # noqa: BLE001 - on its own thread: the run goes on without it
            self.reason = f"GPU monitor failed to start on {self.host}: {type(error).__name__}: {error}"
            log.warning("%s", self.reason)
            opened = False
        if opened:
            self._run()  # sets _opened at its first sample
        self._opened.set()

    def stop(self) -> dict[str, Any]:
        """Stop sampling; the report that rank 0 merges."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            self.sample()  # the run's end: the energy counter's last reading
        if self.available and self.nvml is not None:
            self._release()
            self.nvml = None
        return {
            "host": self.host,
            "rank": self.rank,
            "available": self.available,
            "reason": self.reason,
            "gpus": [{**device.report(), "host": self.host} for device in self.devices],
            "rows": self.rows,
            "cpus": self.cpus,
            "process_query": self._process_note(),
        }

    def sample(self, now: float | None = None) -> None:
        """One row per sampled GPU at `now` (seconds since t0; the clock's if None)."""
        now = time.time() - self.t0 if now is None else now
        load = host_load()
        counters = {
            device.index: self._energy_reading(device) for device in self.devices if not device.failed
        }
        for device in self.devices:
            if device.failed:
                continue
            try:
                read = self._read(device, now)
                joules = device.energy.add(now, counters[device.index], read[POWER])
                values = (*read, *self._processes(device, now), *load, joules)
            except Exception as error:  # noqa: BLE001 - one failing GPU must not stop the others
                device.failed = f"at {now:.1f} s: {type(error).__name__}: {error}"
                log.warning(
                    "GPU monitor: %s (NVML %d) skipped from now on: %s", device.uuid, device.index, error
                )
                continue
            self.rows.append((now, self.host, device.index, device.uuid, device.name, device.rank, *values))

    # -- NVML --

    def _init_nvml(self) -> None:
        if self.nvml is None:
            import pynvml

            self.nvml = pynvml
        self.nvml.nvmlInit()

    def _open_devices(self) -> None:
        nvml, problems, matched = self.nvml, [], set()
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as error:
            self.reason = f"NVML on {self.host} cannot count GPUs: {error}"
            return
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                uuid = _text(nvml.nvmlDeviceGetUUID(handle))
            except nvml.NVMLError as error:
                if _no_permission(nvml, error):  # another job's GPU behind Slurm's device cgroup
                    log.debug("GPU monitor: NVML GPU %d is not this job's: %s", index, error)
                else:
                    problems.append(f"NVML GPU {index}: {error}")  # may be another job's GPU: not fatal
                continue
            if self.wanted is None or uuid_key(uuid) in self.wanted:
                matched.add(uuid_key(uuid))
                try:
                    self.devices.append(self._open(index, handle, uuid))
                except DeviceLost as error:
                    problems.append(f"NVML GPU {index} ({uuid}) is lost: {error}")
        missing = set(self.wanted or ()) - matched
        if missing:
            names = ", ".join(self.wanted[key] for key in sorted(missing))
            problems.insert(0, f"no NVML GPU on {self.host} has UUID {names} (a MIG instance is not matched)")
        if problems:
            self.reason = "; ".join(problems)
            log.warning("GPU monitor: %s", self.reason)
        elif not self.devices:
            self.reason = f"NVML shows no GPU on {self.host}"

    def _open(self, index: int, handle, uuid: str) -> Device:
        nvml = self.nvml
        device = Device(index, uuid, "", self.rank, handle)
        device.watch = GpuWatch(uuid, self.processes.job.expected_on(uuid))
        device.name = _text(self._query(device, "name", nvml.nvmlDeviceGetName, handle) or "")
        limit_mw = self._query(device, "power_limit", nvml.nvmlDeviceGetEnforcedPowerLimit, handle)
        device.power_limit_w = None if limit_mw is None else limit_mw / 1000
        device.energy = open_counter(nvml, handle, device.power_limit_w)
        try:
            device.gpm_supported = bool(nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
            device.gpm_reason = None if device.gpm_supported else "GPM not supported (Hopper or newer needed)"
            if device.gpm_supported:
                device.gpm_samples = [nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()]
        except (nvml.NVMLError, AttributeError) as error:  # AttributeError: an nvidia-ml-py without GPM
            device.gpm_supported, device.gpm_reason = False, f"GPM unavailable: {error}"
        return device

    def _release(self) -> None:
        for device in self.devices:
            for sample in device.gpm_samples:
                try:
                    self.nvml.nvmlGpmSampleFree(sample)
                except Exception as error:  # noqa: BLE001
                    log.debug("nvmlGpmSampleFree: %s", error)
            device.gpm_samples = []
        self._shutdown_nvml()

    def _shutdown_nvml(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except Exception as error:  # noqa: BLE001
            log.debug("nvmlShutdown: %s", error)

    def _run(self) -> None:
        next_time = time.monotonic()
        while not self._stop.is_set():
            self.sample()
            self._opened.set()
            next_time += self.interval_s
            self._stop.wait(max(0.0, next_time - time.monotonic()))

    def _query(self, device: Device, name: str, query, *args):
        """query(*args), or None after an NVML error (counted); a lost GPU raises DeviceLost."""
        nvml = self.nvml
        try:
            return query(*args)
        except nvml.NVMLError as error:
            if getattr(error, "value", None) == getattr(nvml, "NVML_ERROR_GPU_IS_LOST", None):
                raise DeviceLost(str(error)) from error
            device.errors[name] += 1
            device.last_error[name] = str(error)
            return None

    def _energy_reading(self, device: Device) -> int | None:
        """The energy counter (mJ), read before the slower queries; None without one (or on an error)."""
        if not device.energy.supported:
            return None
        try:
            return self._query(device, "energy", self.nvml.nvmlDeviceGetTotalEnergyConsumption, device.handle)
        except DeviceLost:
            return None  # the reads after it find the GPU lost and report it

    def _read(self, device: Device, now: float) -> tuple:
        nvml, handle = self.nvml, device.handle
        sm_active = self._sm_active(device, now)
        utilization = self._query(device, "utilization", nvml.nvmlDeviceGetUtilizationRates, handle)
        power_mw = self._query(device, "power", nvml.nvmlDeviceGetPowerUsage, handle)
        limit_mw = self._query(device, "power_limit", nvml.nvmlDeviceGetEnforcedPowerLimit, handle)
        rx_kb_s = self._query(
            device, "pcie_rx", nvml.nvmlDeviceGetPcieThroughput, handle, nvml.NVML_PCIE_UTIL_RX_BYTES
        )
        tx_kb_s = self._query(
            device, "pcie_tx", nvml.nvmlDeviceGetPcieThroughput, handle, nvml.NVML_PCIE_UTIL_TX_BYTES
        )
        memory = self._query(device, "memory", nvml.nvmlDeviceGetMemoryInfo, handle)
        temperature = self._query(
            device, "temperature", nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU
        )
        power_w = None if power_mw is None else power_mw / 1000
        limit_w = None if limit_mw is None else limit_mw / 1000
        return (
            sm_active,
            None if utilization is None else utilization.gpu,
            None if utilization is None else utilization.memory,
            power_w,
            limit_w,
            power_fraction(power_w, limit_w),
            None if rx_kb_s is None else rx_kb_s / 1000,
            None if tx_kb_s is None else tx_kb_s / 1000,
            None if memory is None else memory.used / 1e6,
            temperature,
        )

    def _processes(self, device: Device, now: float) -> tuple:
        """(processes, foreign_processes, foreign_mem_mb); empty without a process query."""
        listed = self._query(device, "processes", self.processes.listed, device.handle)
        if listed is None:
            return None, None, None
        foreign, comparable = self.processes.foreign(listed, device.uuid)
        return device.watch.observe(now, len(listed), foreign, comparable)

    def _process_note(self) -> str | None:
        """The process query used, or why none answered (None before NVML was opened)."""
        if self.processes is None:
            return None
        query = self.processes.compute
        return (
            f"NVML {query.name}" if query.name else (f"not listed: {query.reason}" if query.reason else None)
        )

    def _sm_active(self, device: Device, now: float) -> float | None:
        """GPM SM activity since the previous GPM sample, once that is GPM_MIN_INTERVAL_S old."""
        if not device.gpm_supported:
            return None
        previous = device.gpm_previous
        if previous is not None and now - device.gpm_previous_time < GPM_MIN_INTERVAL_S:
            return None
        nvml = self.nvml
        current = device.gpm_samples[1] if previous is device.gpm_samples[0] else device.gpm_samples[0]
        if self._query(device, "gpm_sample", nvml.nvmlGpmSampleGet, device.handle, current) is None:
            device.gpm_previous = None  # start a fresh pair
            return None
        device.gpm_previous, device.gpm_previous_time = current, now
        if previous is None:
            return None
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = 1
        request.sample1, request.sample2 = previous, current
        request.metrics[0].metricId = nvml.NVML_GPM_METRIC_SM_UTIL
        result = self._query(device, "gpm_metrics", nvml.nvmlGpmMetricsGet, request)
        if result is None:
            return None
        metric = result.metrics[0]
        if metric.nvmlReturn != nvml.NVML_SUCCESS:
            device.errors["gpm_sm_util"] += 1
            device.last_error["gpm_sm_util"] = f"NVML return code {metric.nvmlReturn}"
            return None
        return float(metric.value)


def _no_permission(nvml, error) -> bool:
    """NVML_ERROR_NO_PERMISSION: under Slurm's device cgroup (ConstrainDevices) NVML still counts the
    node's other GPUs but may not open them; expected there, so not a warning. The rank's own GPU
    missing is still reported (by UUID)."""
    code = getattr(nvml, "NVML_ERROR_NO_PERMISSION", None)
    return code is not None and getattr(error, "value", None) == code


def power_fraction(power_w: float | None, limit_w: float | None) -> float | None:
    """Power draw as a fraction of the enforced limit; None without both or with no limit."""
    if power_w is None or not limit_w:
        return None
    return power_w / limit_w


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
