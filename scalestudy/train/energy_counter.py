"""A GPU's energy from NVML's total energy counter, as the GPU monitor reads it (train.gpu_monitor).

`nvmlDeviceGetTotalEnergyConsumption` counts the millijoules a GPU used since the driver was loaded
(an unsigned 64-bit counter; Volta and later). The monitor reads it first at every sample (before
the slower reads, so that the value belongs to the sample's time) and writes `energy_j`: the joules
the GPU used since the monitor's first reading, so that the energy between two times is the
difference of two rows (scalestudy.analysis.energy interpolates at the measurement window's bounds).

A reading below the previous one is either a wrap of the 64-bit counter (the difference modulo 2^64
is no more than the GPU can draw in the interval: twice its power limit, else MAX_POWER_W) or a
reset (the driver was reloaded: the counter starts again from zero). A wrap adds the modular
difference; a reset's interval is bridged by the power samples on either side (trapezoid), or, without
them, by the new reading (what the counter counted since the reset: a lower bound); the report says
how many of each and how each reset was bridged. A GPU without the counter (before Volta, or an
nvidia-ml-py without the call) leaves `energy_j` empty, and the report says why: the analysis then
integrates the power samples instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from scalestudy.plan.runfiles import NOT_MEASURED

COUNTER_MODULUS = 2**64  # the counter is an unsigned long long
MAX_POWER_W = 10_000.0  # the most a GPU could draw, where its power limit is unknown


@dataclass
class EnergyCounter:
    """One GPU's counter readings turned into joules since the first reading."""

    power_limit_w: float | None = None
    reason: str | None = None  # why the GPU has no counter (None: it has one)
    total_mj: int = 0
    last_mj: int | None = None
    last_time: float | None = None
    last_power_w: float | None = None
    wraps: int = 0
    resets: list[dict[str, Any]] = field(default_factory=list)

    @property
    def supported(self) -> bool:
        return self.reason is None

    def add(self, now: float, reading_mj: int | None, power_w: float | None) -> float | None:
        """The joules since the first reading, after this reading (None: no reading this time)."""
        if reading_mj is not None:
            reading_mj = int(reading_mj)
            if self.last_mj is not None:
                self.total_mj += self._increment(now, reading_mj, power_w)
            self.last_mj, self.last_time = reading_mj, now
        self.last_power_w = power_w if power_w is not None else self.last_power_w
        return None if reading_mj is None else self.total_mj / 1000.0

    def _increment(self, now: float, reading_mj: int, power_w: float | None) -> int:
        if reading_mj >= self.last_mj:
            return reading_mj - self.last_mj
        seconds = max(now - self.last_time, 0.0)
        modular = (reading_mj - self.last_mj) % COUNTER_MODULUS
        most_w = 2.0 * self.power_limit_w if self.power_limit_w else MAX_POWER_W
        if modular <= most_w * seconds * 1000.0:
            self.wraps += 1
            return modular
        if power_w is not None and self.last_power_w is not None:
            bridged, how = round((power_w + self.last_power_w) / 2 * seconds * 1000.0), "power samples"
        else:
            bridged, how = reading_mj, "the new reading (a lower bound: no power samples)"
        self.resets.append({"at_s": round(now, 3), "bridged_by": how})
        return bridged

    def report(self) -> dict[str, Any]:
        return {
            "counter": self.supported,
            "reason": self.reason,
            "wraps": self.wraps,
            "resets": self.resets,
        }


def open_counter(nvml, handle, power_limit_w: float | None) -> EnergyCounter:
    """The GPU's counter, or why it has none (read once here: an unsupported call is not repeated)."""
    counter = EnergyCounter(power_limit_w)
    try:
        nvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    except AttributeError as error:  # an nvidia-ml-py without the call
        counter.reason = f"no energy counter in this pynvml: {error}"
    except nvml.NVMLError as error:
        counter.reason = f"no energy counter: {error} (NVML has it on Volta and later)"
    return counter


def energy_note(gpus: list[dict[str, Any]]) -> str:
    """gpu_monitor.json's `energy`: where the GPUs' energy comes from."""
    if not gpus:
        return f"{NOT_MEASURED}: no GPU sampled"
    without = sorted(
        {f"{gpu['uuid']}: {(gpu.get('energy') or {}).get('reason')}" for gpu in gpus if not _has(gpu)}
    )
    if not without:
        return "NVML total energy counter"
    return "power samples integrated on " + "; ".join(without)


def _has(gpu: dict[str, Any]) -> bool:
    return bool((gpu.get("energy") or {}).get("counter"))
