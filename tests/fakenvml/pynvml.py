"""A stand-in `pynvml` for CPU tests: put this folder first on PYTHONPATH (for Snakemake and every
job it starts) and name a JSON state file in SCALESTUDY_FAKE_NVML. The file is the machine: it is
read again on every call, so a test may change it while jobs run (a process appears on a GPU).

    {"driver": "580.65.06", "cuda_driver": 13000,
     "gpus": [{"uuid": "GPU-...", "name": "NVIDIA H200", "memory_total": 150000000000,
               "processes": [{"pid": 4242, "used_memory": 3100000000}]}]}

Only `gpus` is required (each entry's `uuid`); a GPU's `energy_mj` (the total energy counter),
`power_mw` and `power_limit_mw` answer the GPU monitor's reads where given (NOT_SUPPORTED where not:
a GPU without the energy counter leaves out `energy_mj`); `"driver_loaded": false` makes nvmlInit fail as on a
machine without a driver, and SCALESTUDY_FAKE_NVML unset as on one without NVML. The calls the
project makes where GPUs are listed and their processes read are here (scalestudy.launch.gpus,
scalestudy.preflight.nvidia, the command workload's device check, the monitor's process list);
any other nvml* function raises NVMLError(NVML_ERROR_NOT_SUPPORTED), as pynvml does for a query the
driver cannot answer. Constants have pynvml 13's values (tests/test_gpu_alloc.py compares them).
"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

STATE_ENV = "SCALESTUDY_FAKE_NVML"

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999
NVML_CLOCK_GRAPHICS, NVML_CLOCK_SM, NVML_CLOCK_MEM = 0, 1, 2
NVML_TEMPERATURE_GPU = 0
NVML_PCIE_UTIL_TX_BYTES, NVML_PCIE_UTIL_RX_BYTES = 0, 1

_MESSAGES = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}


class NVMLError(Exception):
    """pynvml's error: `value` is the NVML return code; str() its message."""

    def __init__(self, value: int):
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _MESSAGES.get(self.value, f"NVML error {self.value}")


_initialised = 0


def _state() -> dict:
    path = os.environ.get(STATE_ENV)
    if not path:
        raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
    with open(path) as handle:
        state = json.load(handle)
    if not state.get("driver_loaded", True):
        raise NVMLError(NVML_ERROR_DRIVER_NOT_LOADED)
    return state


def _gpus() -> list[dict]:
    if not _initialised:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    return _state()["gpus"]


def _gpu(handle) -> dict:
    gpus = _gpus()
    if not isinstance(handle, SimpleNamespace) or not 0 <= handle.index < len(gpus):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return gpus[handle.index]


# --------------------------------------------------------------------------- the calls


def nvmlInit() -> None:
    global _initialised
    _state()
    _initialised += 1


def nvmlShutdown() -> None:
    global _initialised
    if not _initialised:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    _initialised -= 1


def nvmlSystemGetDriverVersion() -> str:
    _gpus()
    return _state().get("driver", "580.65.06")


def nvmlSystemGetCudaDriverVersion() -> int:
    _gpus()
    return int(_state().get("cuda_driver", 13000))


def nvmlDeviceGetCount() -> int:
    return len(_gpus())


def nvmlDeviceGetHandleByIndex(index: int) -> SimpleNamespace:
    if not 0 <= index < len(_gpus()):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return SimpleNamespace(index=index)


def nvmlDeviceGetHandleByUUID(uuid) -> SimpleNamespace:
    uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
    for index, gpu in enumerate(_gpus()):
        if gpu["uuid"] == uuid:
            return SimpleNamespace(index=index)
    raise NVMLError(NVML_ERROR_NOT_FOUND)


def nvmlDeviceGetIndex(handle) -> int:
    _gpu(handle)
    return handle.index


def nvmlDeviceGetUUID(handle) -> str:
    return _gpu(handle)["uuid"]


def nvmlDeviceGetName(handle) -> str:
    return _gpu(handle).get("name", "NVIDIA H200")


def nvmlDeviceGetMemoryInfo(handle) -> SimpleNamespace:
    gpu = _gpu(handle)
    total = int(gpu.get("memory_total", 150_000_000_000))
    used = sum(int(process.get("used_memory") or 0) for process in gpu.get("processes", []))
    return SimpleNamespace(total=total, used=used, free=total - used)


def nvmlDeviceGetTotalEnergyConsumption(handle) -> int:
    """The GPU's `energy_mj` (mJ since the driver loaded); a GPU without it has no counter."""
    return int(_reading(handle, "energy_mj"))


def nvmlDeviceGetPowerUsage(handle) -> int:
    return int(_reading(handle, "power_mw"))


def nvmlDeviceGetEnforcedPowerLimit(handle) -> int:
    return int(_reading(handle, "power_limit_mw"))


def _reading(handle, key: str):
    """A GPU's `key` from the state file; NVML_ERROR_NOT_SUPPORTED where the state has none."""
    gpu = _gpu(handle)
    if gpu.get(key) is None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return gpu[key]


def nvmlDeviceGetComputeRunningProcesses(handle) -> list[SimpleNamespace]:
    """pid and usedGpuMemory (bytes; None where NVML cannot say, as pynvml gives it)."""
    return [
        SimpleNamespace(
            pid=int(process["pid"]),
            usedGpuMemory=process.get("used_memory"),
            gpuInstanceId=0xFFFFFFFF,
            computeInstanceId=0xFFFFFFFF,
        )
        for process in _gpu(handle).get("processes", [])
    ]


def __getattr__(name: str):
    """Any other NVML function exists and is not supported by this machine."""
    if name.startswith("nvml"):

        def not_supported(*args, **kwargs):
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)

        not_supported.__name__ = name
        return not_supported
    raise AttributeError(f"module 'pynvml' (the tests' fake) has no attribute {name!r}")
