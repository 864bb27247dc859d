"""Model FLOPs utilisation of a run, only against a peak that is known for its device or configured.

MFU = x * training FLOPs per sample / the device's peak FLOP/s at the run's precision, x the
samples/s of one rank: the workload's closed form where its spec has one (`closed_form`: the
ResNet-18's of its width) times analysis.train_flops_factor, else the training FLOPs its trainer
counted (the LM's 6N + attention per token); never a formula guessed from a column. The peak is
analysis.peak_tflops's entry for the device (`find_peak_tflops`). Where there is none, or it is the
schema's `cpu` entry (PLACEHOLDER_PEAKS: a number for the LM benchmark's table, no CPU's peak) and
the config did not set another value, MFU is empty and `mfu_note` says why: a CPU study's MFU
against 0.1 TFLOP/s would read as a measurement.
"""

from __future__ import annotations

import logging
import math

import pandas as pd

from scalestudy.plan import schema, workloads

log = logging.getLogger("scalestudy.analysis.metrics")

# analysis.peak_tflops entries of the schema's default that are placeholders, not a device's peak
PLACEHOLDER_PEAKS = {
    key: value for key, value in schema.node("analysis", "peak_tflops")["default"].items() if key == "cpu"
}
NO_FLOPS = "no FLOP count for this workload"


def find_peak_tflops(
    peaks: dict, device_name: object, device: object, precision: str
) -> tuple[float, str | None]:
    """The peak TFLOP/s for a device and precision: the longest key found in device_name, else device."""
    name = str(device_name or "").lower()
    matches = [key for key in peaks if key.lower() in name] or [
        key for key in peaks if key.lower() == str(device or "").lower()
    ]
    if not matches:
        return math.nan, None
    key = max(matches, key=len)
    if precision not in peaks[key]:
        return math.nan, key
    return float(peaks[key][precision]), key


def known_peak(peaks: dict, device_name: object, device: object, precision: str) -> tuple[float, str]:
    """(peak TFLOP/s, '') where one is known for the device, else (NaN, why not)."""
    peak, key = find_peak_tflops(peaks, device_name, device, precision)
    where = "analysis.peak_tflops"
    if key is None:
        return math.nan, f"no {where} entry matches the device ({device_name}, {device}): no peak known"
    if key in PLACEHOLDER_PEAKS and peaks[key] == PLACEHOLDER_PEAKS[key]:
        return math.nan, (
            f"{where}.{key} is the schema's placeholder, not this device's peak ({device_name}):"
            f" set its peak TFLOP/s in {where} for an MFU"
        )
    if math.isnan(peak):
        return math.nan, f"{where}.{key} gives no peak for precision {precision}"
    return peak, ""


def closed_form(r: pd.Series) -> tuple[int, float] | None:
    """(parameters, forward FLOPs per sample) of a run's model from its workload's closed form (its
    spec's model_size over the run's config.* columns: the ResNet's of its width); None where the
    workload has none (the LM, a script: their trainers count) or the run lacks what it needs. A
    catalog without a workload column is the default workload's (the ResNet study's)."""
    name = r.get("workload")
    spec = workloads.WORKLOADS.get(workloads.DEFAULT if _missing(name) else name)
    if spec is None or spec.model_size is None:
        return None
    run = {key.removeprefix("config."): value for key, value in r.items() if key.startswith("config.")}
    return spec.closed_form({key: value for key, value in run.items() if not _missing(value)})


def closed_form_flops(runs: pd.DataFrame) -> pd.Series:
    """The forward FLOPs per sample of each run's closed form (closed_form); NaN where there is none."""
    sizes = [closed_form(r) for _, r in runs.iterrows()]
    return pd.Series([math.nan if size is None else size[1] for size in sizes], index=runs.index, dtype=float)


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def of_run(r: pd.Series, settings: dict) -> tuple[float, str]:
    """A run's (MFU, why empty): from its closed form's training FLOPs per sample (forward x
    analysis.train_flops_factor) where its workload has one, else from those its trainer counted;
    else NaN."""
    size = closed_form(r)
    flops = settings["train_flops_factor"] * size[1] if size else r.get("train_flops_per_image")
    if flops is None or pd.isna(flops):
        return math.nan, NO_FLOPS
    peak, why = known_peak(settings["peak_tflops"], r["device_name"], r["device"], r["precision"])
    return r["images_per_s_per_gpu"] * flops / (peak * 1e12), why


def of_runs(runs: pd.DataFrame, settings: dict) -> tuple[pd.Series, pd.Series]:
    """Every run's MFU and `mfu_note` (why it is empty; '' where it is not); each reason logged once."""
    pairs = [of_run(r, settings) for _, r in runs.iterrows()]
    values = pd.Series([value for value, _ in pairs], index=runs.index, dtype=float)
    notes = pd.Series([why for _, why in pairs], index=runs.index, dtype=object)
    for why, count in notes[notes != ""].value_counts().items():
        (log.info if why == NO_FLOPS or "placeholder" in why else log.warning)(
            "MFU left empty for %d run(s): %s", count, why
        )
    check_flops(runs, closed_form_flops(runs))
    return values, notes


def check_flops(runs: pd.DataFrame, forward: pd.Series) -> None:
    """MFU uses the workload's closed form; say so if the trainer's flop counter disagrees."""
    if "forward_flops_per_image" not in runs:
        return
    counted = pd.to_numeric(runs["forward_flops_per_image"], errors="coerce")
    for index in runs.index[counted.notna() & forward.notna()]:
        r = runs.loc[index]
        if abs(counted[index] / forward[index] - 1.0) > 0.05:
            log.warning(
                "%s/%s: the trainer counted %.4g forward FLOPs per sample, the workload's closed form %.4g",
                r["stage"],
                r["point"],
                counted[index],
                forward[index],
            )
