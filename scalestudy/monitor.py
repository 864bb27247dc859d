"""GPU sampling with NVML: one sampler thread per node, every local GPU, at a fixed rate.

Local rank 0 of each node starts a `NodeMonitor`; it keeps its rows in memory. At the end of the
run every rank hands its monitor's report (or None) to rank 0 (gather_object), and rank 0 writes
one `gpu_monitor.csv` for the run, sorted by time, host and GPU, plus `gpu_monitor.json` (available,
reason, per-node GPUs). Gathering instead of per-node files keeps the rule that only rank 0 writes
into the run folder; the data are small (12 numbers per GPU per sample).

Without NVML (no driver, no GPU) the node report says why, the CSV has its header and no rows, and
the run goes on. Units: MB = 10^6 bytes (PCIe throughput from NVML's KB/s, memory from bytes),
power in W (NVML reports mW). A metric a GPU does not support is left empty.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from pathlib import Path
from typing import Any

from scalestudy import atomic
from scalestudy.runfiles import MONITOR_COLUMNS as COLUMNS

log = logging.getLogger("scalestudy.monitor")


class NodeMonitor:
    """Samples every GPU NVML shows on this node every `interval_s` on a daemon thread.

    `t0` is the run's start (time.time() on rank 0), so time_s lines up across nodes and with the
    trainer's wall_time_s. `nvml` is the pynvml module (a test may pass a stand-in).
    """

    def __init__(self, interval_s: float = 1.0, t0: float | None = None, host: str | None = None, nvml=None):
        if interval_s <= 0:
            raise ValueError(f"monitor_interval_s must be positive, got {interval_s}")
        self.interval_s = interval_s
        self.t0 = time.time() if t0 is None else t0
        self.host = host or socket.gethostname()
        self.nvml = nvml
        self.available = False
        self.reason: str | None = None
        self.gpus: list[dict[str, Any]] = []
        self.rows: list[tuple] = []
        self._handles: list[Any] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> NodeMonitor:
        try:
            self._init_nvml()
        except Exception as error:  # noqa: BLE001 - no NVML is a normal situation (CPU runs)
            self.reason = f"NVML unavailable on {self.host}: {type(error).__name__}: {error}"
            log.info("GPU monitor off: %s", self.reason)
            return self
        if not self._handles:
            self.reason = f"NVML shows no GPU on {self.host}"
            self._shutdown_nvml()
            return self
        self.available = True
        self._thread = threading.Thread(target=self._run, name="gpu-monitor", daemon=True)
        self._thread.start()
        log.info("GPU monitor: %d GPUs on %s every %.2f s", len(self._handles), self.host, self.interval_s)
        return self

    def stop(self) -> dict[str, Any]:
        """Stop sampling; the report that rank 0 merges."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            self._shutdown_nvml()
        return {
            "host": self.host,
            "available": self.available,
            "reason": self.reason,
            "gpus": self.gpus,
            "rows": self.rows,
        }

    def sample(self) -> None:
        now = time.time() - self.t0
        for gpu, handle in zip(self.gpus, self._handles, strict=True):
            self.rows.append((now, self.host, gpu["index"], gpu["uuid"], gpu["name"], *self._read(handle)))

    def _init_nvml(self) -> None:
        if self.nvml is None:
            import pynvml

            self.nvml = pynvml
        self.nvml.nvmlInit()
        for index in range(self.nvml.nvmlDeviceGetCount()):
            handle = self.nvml.nvmlDeviceGetHandleByIndex(index)
            self._handles.append(handle)
            self.gpus.append(
                {
                    "index": index,
                    "uuid": _text(self.nvml.nvmlDeviceGetUUID(handle)),
                    "name": _text(self.nvml.nvmlDeviceGetName(handle)),
                }
            )

    def _shutdown_nvml(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except Exception as error:  # noqa: BLE001
            log.debug("nvmlShutdown: %s", error)

    def _run(self) -> None:
        next_time = time.monotonic()
        while not self._stop.is_set():
            self.sample()
            next_time += self.interval_s
            self._stop.wait(max(0.0, next_time - time.monotonic()))

    def _read(self, handle) -> tuple:
        nvml = self.nvml
        utilization = _try(nvml, nvml.nvmlDeviceGetUtilizationRates, handle)
        power_mw = _try(nvml, nvml.nvmlDeviceGetPowerUsage, handle)
        rx_kb_s = _try(nvml, nvml.nvmlDeviceGetPcieThroughput, handle, nvml.NVML_PCIE_UTIL_RX_BYTES)
        tx_kb_s = _try(nvml, nvml.nvmlDeviceGetPcieThroughput, handle, nvml.NVML_PCIE_UTIL_TX_BYTES)
        memory = _try(nvml, nvml.nvmlDeviceGetMemoryInfo, handle)
        temperature = _try(nvml, nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU)
        return (
            None if utilization is None else utilization.gpu,
            None if utilization is None else utilization.memory,
            None if power_mw is None else power_mw / 1000,
            None if rx_kb_s is None else rx_kb_s / 1000,
            None if tx_kb_s is None else tx_kb_s / 1000,
            None if memory is None else memory.used / 1e6,
            temperature,
        )


def _try(nvml, query, *args):
    try:
        return query(*args)
    except nvml.NVMLError:
        return None


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def write_outputs(out_dir: str | Path, reports: list[dict[str, Any] | None], interval_s: float) -> None:
    """Rank 0: merge the node reports into gpu_monitor.csv and gpu_monitor.json."""
    import pandas as pd

    reports = [report for report in reports if report is not None]
    rows = sorted((row for report in reports for row in report["rows"]), key=lambda row: row[:3])
    atomic.write_csv(Path(out_dir) / "gpu_monitor.csv", pd.DataFrame(rows, columns=COLUMNS))
    reasons = [report["reason"] for report in reports if not report["available"]]
    summary = {
        "available": bool(reports) and not reasons,
        "reason": "; ".join(reasons) if reasons else (None if reports else "no node ran a monitor"),
        "interval_s": interval_s,
        "samples": len(rows),
        "nodes": [
            {key: report[key] for key in ("host", "available", "reason", "gpus")} for report in reports
        ],
    }
    atomic.write_json(Path(out_dir) / "gpu_monitor.json", summary)
