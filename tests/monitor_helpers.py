"""The stand-in NVML the GPU monitor's tests drive it with (FakeNvml: pynvml's calls for three GPUs)
and the two steps they share: sampling a monitor at given times, and its rows as a frame."""

from types import SimpleNamespace

import pandas as pd

from scalestudy.plan.runfiles import MONITOR_COLUMNS as COLUMNS
from scalestudy.train.gpu_monitor import GpuMonitor

UUIDS = (
    "GPU-0a1b2c3d-0000-1111-2222-333344445555",
    "GPU-0a1b2c3d-0000-1111-2222-333344446666",
    "GPU-0a1b2c3d-0000-1111-2222-333344447777",
)
SM_ACTIVE = (71.5, 64.0, 80.0)  # what the stand-in's GPM reports per GPU


class FakeNvml:
    """The pynvml calls the monitor makes, for three GPUs (with pynvml's constants).

    gpm: per GPU whether nvmlGpmQueryDeviceSupport says yes. lost_after: {GPU: n} raises
    NVML_ERROR_GPU_IS_LOST from the n-th power reading on. no_pcie: GPUs without PCIe counters.
    energy: {GPU: [mJ, ...]} the energy counter's readings in turn (the first is the monitor's check
    at open); without, the counter rises by the power reading x 0.1 s per reading. no_energy: GPUs
    without the counter (NVML_ERROR_NOT_SUPPORTED, as before Volta). power_w: the power readings.
    """

    NVML_PCIE_UTIL_TX_BYTES, NVML_PCIE_UTIL_RX_BYTES, NVML_TEMPERATURE_GPU = 0, 1, 0
    NVML_SUCCESS, NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_NO_PERMISSION, NVML_ERROR_GPU_IS_LOST = 0, 3, 4, 15
    NVML_GPM_METRICS_GET_VERSION, NVML_GPM_METRIC_SM_UTIL = 1, 2

    class NVMLError(Exception):
        def __init__(self, value):
            super().__init__({3: "Not Supported", 15: "GPU is lost"}.get(value, f"error {value}"))
            self.value = value

    def __init__(
        self,
        gpm=(True, True, True),
        lost_after=None,
        no_pcie=(),
        bad_handle=(),
        not_ours=(),
        energy=None,
        no_energy=(),
        power_w=(350.5, 351.5, 352.5),
    ):
        self.gpm, self.lost_after, self.no_pcie, self.bad_handle = gpm, lost_after or {}, no_pcie, bad_handle
        self.not_ours = not_ours  # GPUs of other jobs: NVML_ERROR_NO_PERMISSION (Slurm's device cgroup)
        self.energy, self.no_energy, self.power_w = energy, no_energy, power_w
        self.energy_calls = [0, 0, 0]
        self.initialised = False
        self.power_calls = [0, 0, 0]
        self.gpm_counter = 0
        self.samples_alive = 0

    def nvmlInit(self):
        self.initialised = True

    def nvmlShutdown(self):
        self.initialised = False

    def nvmlDeviceGetCount(self):
        return len(UUIDS)

    def nvmlDeviceGetHandleByIndex(self, index):
        if index in self.bad_handle:
            raise self.NVMLError(999)
        if index in self.not_ours:
            raise self.NVMLError(self.NVML_ERROR_NO_PERMISSION)
        return index

    def nvmlDeviceGetUUID(self, handle):
        return UUIDS[handle]  # pynvml 13 returns str (older ones bytes)

    def nvmlDeviceGetName(self, handle):
        return b"NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetEnforcedPowerLimit(self, handle):
        return 700_000  # mW

    def nvmlDeviceGetUtilizationRates(self, handle):
        return SimpleNamespace(gpu=99, memory=40)

    def nvmlDeviceGetPowerUsage(self, handle):
        self.power_calls[handle] += 1
        if handle in self.lost_after and self.power_calls[handle] >= self.lost_after[handle]:
            raise self.NVMLError(self.NVML_ERROR_GPU_IS_LOST)
        return round(self.power_w[handle] * 1000)  # mW

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        if handle in self.no_energy:
            raise self.NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        calls = self.energy_calls[handle]
        self.energy_calls[handle] += 1
        if self.energy is None:
            return 10**9 + round(self.power_w[handle] * 100) * calls  # mJ: power x 0.1 s per reading
        return self.energy[handle][calls]

    def nvmlDeviceGetPcieThroughput(self, handle, counter):
        if handle in self.no_pcie:
            raise self.NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        return 12_000 if counter == self.NVML_PCIE_UTIL_RX_BYTES else 3_000  # KB/s

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(used=2_500_000_000, total=80_000_000_000)

    def nvmlDeviceGetTemperature(self, handle, sensor):
        return 61

    # GPM
    def nvmlGpmQueryDeviceSupport(self, handle):
        return SimpleNamespace(isSupportedDevice=int(self.gpm[handle]))

    def nvmlGpmSampleAlloc(self):
        self.samples_alive += 1
        return SimpleNamespace(device=None, counter=None)

    def nvmlGpmSampleFree(self, sample):
        self.samples_alive -= 1

    def nvmlGpmSampleGet(self, handle, sample):
        self.gpm_counter += 1
        sample.device, sample.counter = handle, self.gpm_counter
        return sample

    @staticmethod
    def c_nvmlGpmMetricsGet_t():
        metrics = [SimpleNamespace(metricId=0, nvmlReturn=-1, value=0.0) for _ in range(4)]
        return SimpleNamespace(version=0, numMetrics=0, sample1=None, sample2=None, metrics=metrics)

    def nvmlGpmMetricsGet(self, request):
        one, two = request.sample1, request.sample2
        assert request.version == 1 and request.numMetrics == 1 and one is not two
        assert one.device == two.device and one.counter < two.counter  # two samples of one GPU, in order
        metric = request.metrics[0]
        assert metric.metricId == self.NVML_GPM_METRIC_SM_UTIL
        metric.nvmlReturn, metric.value = self.NVML_SUCCESS, SM_ACTIVE[one.device]
        return request


def rows_of(report) -> pd.DataFrame:
    return pd.DataFrame(report["rows"], columns=COLUMNS)


def sampled(nvml, times, **kwargs):
    """A monitor opened on `nvml` and sampled at the given times (no thread), then stopped."""
    node = GpuMonitor(interval_s=0.1, t0=0.0, host="gpu01", nvml=nvml, **kwargs)
    assert node.open()
    for now in times:
        node.sample(now)
    return node.stop()
