"""The macros of the paper's first sections (scalestudy.paper.numbers calls every writer in SECTIONS).

Values carry their units (images/s or the workload's tokens/s, s, GPU-hours); wording that depends
on the data (verdicts, "not measured", GPU vs CPU rank, synthetic vs CIFAR-10, the workload: the
ResNet or the LM or the user's script, DDP and FSDP) is chosen here, so that the template's prose
holds no number and no claim the data may contradict.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pandas as pd

from scalestudy.analysis import execution
from scalestudy.analysis.series import DDP, parallelism_of
from scalestudy.paper.macros import NOT_MEASURED, Numbers
from scalestudy.paper.tables import escape, integer, number, percent
from scalestudy.plan import workloads
from scalestudy.plan.workload_spec import SCRIPT_WORDS

IMAGES_PER_S = r"~images/s"
OPTIMIZERS = {"sgd": "SGD", "adamw": "AdamW"}
PARALLELISM_NAMES = {"ddp": r"DDP~\cite{pytorchddp}", "fsdp": r"FSDP~\cite{zhao2023fsdp}"}


def is_missing(value: Any) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))


def formatted(value: Any, formatter: Callable[[Any], str], unit: str = "") -> str:
    return NOT_MEASURED if is_missing(value) else formatter(value) + unit


def seconds(value: Any) -> str:
    """Seconds with a unit that keeps three significant digits readable (ms below one second)."""
    if is_missing(value):
        return NOT_MEASURED
    value = float(value)
    return f"{number(3)(value * 1000)}~ms" if abs(value) < 1 else f"{number(3)(value)}~s"


def join(items: list[str]) -> str:
    items = [str(item) for item in items]
    if len(items) <= 2:
        return " and ".join(items)
    return ", ".join(items[:-1]) + ", and " + items[-1]


class Data:
    """The tables (None where not given) and the config context, with lookups the sections share."""

    def __init__(self, tables: dict[str, pd.DataFrame | None], context: dict[str, Any]) -> None:
        self.tables = tables
        self.context = context
        runs = self.table("runs")
        # how the study ran: its executor, Slurm where it ran (scalestudy.paper.execution's words)
        self.execution = execution.describe(pd.DataFrame() if runs is None else runs, self.table("system"))
        devices = set(runs["device"].dropna().astype(str)) if runs is not None and "device" in runs else set()
        on_gpu = any(d.startswith("cuda") for d in devices) if devices else context["device"] != "cpu"
        self.unit = "GPU" if on_gpu else "CPU rank"
        self.units = self.unit + "s"
        self.workload = str(first_value(runs, "workload") or context["workload"])
        self.sample_unit = str(first_value(runs, "sample_unit") or context["sample_unit"])
        self.per_s = f"~{self.sample_unit}/s"
        # the workload's words (its spec's; a name no package defines: a script's) and its metric
        spec = workloads.WORKLOADS.get(self.workload)
        self.words = spec.paper if spec else SCRIPT_WORDS
        self.metric = spec.metric if spec else "none"
        self.default_optimizer = workloads.default_optimizer(self.workload)
        self.batch_items = self.words.batch_items  # what a batch counts; throughput counts sample_unit

    def table(self, name: str) -> pd.DataFrame | None:
        frame = self.tables.get(name)
        return frame if frame is not None and len(frame) else None

    def run_ids(self, stage: str, **columns: Any) -> str:
        """The run ids (stage/point) of runs.csv rows matching the columns, for a macro's comment."""
        runs = self.table("runs")
        if runs is None:
            return "runs: runs.csv not given"
        chosen = runs[runs["stage"] == stage]
        for column, value in columns.items():
            if column in chosen:
                chosen = chosen[chosen[column].map(lambda cell, value=value: _same(cell, value)).astype(bool)]
        ids = [f"{stage}/{point}" for point in chosen["point"]]
        return "runs: " + (", ".join(ids) if ids else "none")


def _same(cell: Any, value: Any) -> bool:
    """Equal as numbers where both are (25 == 25.0), else as text."""
    try:
        return float(cell) == float(value)
    except (TypeError, ValueError):
        return str(cell) == str(value)


def study(numbers: Numbers, data: Data) -> None:
    context = data.context
    config = "config: "
    numbers.add(
        "StudyTitle",
        escape(context["title"] or "A scaling study of data-parallel training"),
        config + "study.title",
    )
    numbers.add("Unit", data.unit, "runs.csv device column (cuda: GPU; else CPU rank)")
    numbers.add("Units", data.units, "runs.csv device column")
    numbers.add("UnitHours", f"{data.unit}-hours".replace(" ", "-"), "runs.csv device column")
    numbers.add("SampleUnit", escape(data.sample_unit), "runs.csv sample_unit (what throughput counts)")
    numbers.add("BatchItems", data.batch_items, "runs.csv workload (what a batch counts)")
    numbers.add("BatchItem", data.batch_items.removesuffix("s"), "runs.csv workload (what a batch counts)")
    _data_macros(numbers, data)
    _model_macros(numbers, data)
    runs = data.table("runs")
    parallelisms = distinct(runs, "parallelism") or list(context["parallelism"])
    numbers.add(
        "ParallelismName",
        join([PARALLELISM_NAMES.get(p, escape(p.upper())) for p in sorted(parallelisms)]),
        "runs.csv parallelism (else config: scaling.parallelism)",
    )
    numbers.add("Backend", escape(first_value(runs, "backend") or NOT_MEASURED), "runs.csv backend")


def _data_macros(numbers: Numbers, data: Data) -> None:
    source = data.context["data_source"]
    synthetic = source == "synthetic"
    where = f"config: data.source={source}; runs.csv workload={data.workload}"
    words = data.words
    numbers.add("DatasetName", words.dataset, where)
    numbers.add("DataSource", words.data_synthetic if synthetic else words.data_real, where)
    subject = words.subject
    caveat = (
        f"These numbers exercise the pipeline; they say nothing about {subject}"
        + (" or GPUs" if data.unit != "GPU" else "")
        + "."
        if synthetic
        else ""
    )
    numbers.add("DataCaveat", caveat, where)


def _model_macros(numbers: Numbers, data: Data) -> None:
    runs = data.table("runs")
    words = data.words
    details = {field: first_value(runs, column) for field, column in words.model_columns}
    known = bool(details) and all(value is not None for value in details.values())
    name = words.model + (words.model_details.format(**_detail_words(details)) if known else "")
    columns = [column for _, column in words.model_columns]
    source = "runs.csv " + (columns[0] if len(columns) == 1 else _common_columns(columns))
    numbers.add("ModelName", name, source)
    numbers.add("ModelCite", words.cite, "runs.csv workload")
    numbers.add(
        "ModelParameters", formatted(first_value(runs, "parameters"), number(3)), "runs.csv parameters"
    )
    optimizer = first_value(runs, "config.optimizer") or data.default_optimizer
    numbers.add(
        "Optimizer",
        OPTIMIZERS.get(str(optimizer), escape(optimizer or "the script's optimizer")),
        "runs.csv config.optimizer (else the workload's default)",
    )


def _detail_words(details: dict[str, Any]) -> dict[str, str]:
    """A model detail as the paper writes it: a number as an integer, text escaped for LaTeX."""
    return {key: escape(v) if isinstance(v, str) else str(int(v)) for key, v in details.items()}


def _common_columns(columns: list[str]) -> str:
    """config.gpt.layers, config.gpt.heads -> config.gpt.layers/heads (the columns' shared prefix)."""
    prefix = columns[0].rpartition(".")[0] + "."
    if not all(column.startswith(prefix) for column in columns):
        return ", ".join(columns)
    return prefix + "/".join(column.removeprefix(prefix) for column in columns)


def max_value(frame: pd.DataFrame | None, column: str) -> Any:
    """The largest value of `column`, or None where the frame or the column is missing."""
    if frame is None or column not in frame or frame[column].dropna().empty:
        return None
    return frame[column].max()


def first_value(frame: pd.DataFrame | None, column: str) -> Any:
    if frame is None or column not in frame:
        return None
    values = frame[column].dropna()
    return values.iloc[0] if len(values) else None


def distinct(frame: pd.DataFrame | None, column: str) -> list[str]:
    if frame is None or column not in frame:
        return []
    return sorted({str(v) for v in frame[column].dropna() if str(v) not in ("", "nan")})


# results/tables/system.csv (scalestudy.preflight.system, one row per host): macro -> (columns, how one host
# reads); "none" is what sysinfo writes where a host has no such device.
def ddp_rows(table: pd.DataFrame) -> pd.Series:
    """The DDP rows of a table with a parallelism column (the numbers the text quotes), else all."""
    return parallelism_of(table).isin([DDP, ""])


NONE = "none"


def _gpus(row: dict) -> str:
    if str(row["gpus"]) in ("0", "", NONE) or row["gpu_model"] == NONE:
        return NONE
    return f"{row['gpus']}x {row['gpu_model']}"


SYSTEM_FIELDS = {
    "SystemCPU": (("cpu_model", "cores"), lambda r: f"{r['cpu_model']} ({r['cores']} cores)"),
    "SystemGPU": (("gpus", "gpu_model"), _gpus),
    "SystemNetwork": (
        ("infiniband", "network"),
        lambda r: f"InfiniBand {r['infiniband']}, network {r['network']}",
    ),
    "SystemOS": (("os", "kernel"), lambda r: f"{r['os']}, kernel {r['kernel']}"),
    "SystemDriver": (
        ("gpu_driver", "cuda_driver"),
        lambda r: NONE if r["gpu_driver"] == NONE else f"{r['gpu_driver']} (CUDA driver {r['cuda_driver']})",
    ),
}
VERSIONS = {
    "TorchVersion": "torch",
    "TorchvisionVersion": "torchvision",
    "PythonVersion": "python",
    "SnakemakeVersion": "snakemake",
    "CudaVersion": "cuda",
    "NcclVersion": "nccl",
    "PandasVersion": "pandas",
    "MatplotlibVersion": "matplotlib",
}


def system(numbers: Numbers, data: Data) -> None:
    runs = data.table("runs")
    hosts = distinct(runs, "hosts")
    numbers.add("HostList", escape(", ".join(hosts)) if hosts else NOT_MEASURED, "runs.csv hosts (all runs)")
    numbers.add("HostCount", str(len(hosts)) if hosts else NOT_MEASURED, "runs.csv hosts (distinct)")
    names = distinct(runs, "device_name")
    numbers.add("DeviceName", escape(", ".join(names)) if names else NOT_MEASURED, "runs.csv device_name")
    named = f" ({escape(', '.join(names))})" if names else ""
    rank = "each rank driving one GPU" if data.unit == "GPU" else "each rank a process on the CPU"
    numbers.add("RankDevice", rank + named, "runs.csv device, device_name")
    platforms = distinct(runs, "provenance.platform")
    images = distinct(runs, "provenance.image")
    digests = distinct(runs, "provenance.image_sha256")
    numbers.add(
        "ContainerImage",
        "the Apptainer image "
        + escape(", ".join(images))
        + (f" (sha256 {escape(', '.join(d[:12] for d in digests))})" if digests else "")
        if images
        else "no container image (none recorded by the runs)",
        "runs.csv provenance.image, provenance.image_sha256",
    )
    numbers.add(
        "Platform",
        escape(", ".join(platforms)) if platforms else NOT_MEASURED,
        "runs.csv provenance.platform",
    )
    for macro, package in VERSIONS.items():
        values = distinct(runs, f"provenance.versions.{package}")
        numbers.add(
            macro,
            escape(", ".join(values)) if values else NOT_MEASURED,
            f"runs.csv provenance.versions.{package}",
        )
    table = data.table("system")
    for macro, (columns, describe) in SYSTEM_FIELDS.items():
        if table is None or not set(columns) <= set(table.columns):
            why = "not given" if table is None else "lacks " + "/".join(columns)
            numbers.add(macro, NOT_MEASURED, f"system.csv {why}")
            continue
        hosts = table.fillna("").astype(str).to_dict("records")
        value = "; ".join(sorted({str(describe(row)) for row in hosts}))
        where = ", ".join(sorted({row.get("host", "?") for row in hosts}))
        numbers.add(macro, escape(value) or NOT_MEASURED, f"system.csv {'+'.join(columns)} (hosts {where})")


def method(numbers: Numbers, data: Data) -> None:
    runs = data.table("runs")
    scaling_runs = runs[runs["stage"] == "scaling"] if runs is not None else None
    source = "runs.csv stage=scaling "
    for macro, column, formatter in (
        ("ScalingEpochs", "config.epochs", integer),
        ("MeasureWarmupSteps", "warmup_steps", integer),
        ("MeasureSteps", "measure_steps", integer),
        ("LearningRate", "config.lr", number(3)),
        ("LrScaling", "config.lr_scaling", escape),
        ("Seed", "config.seed", integer),
        ("TrainPrecision", "config.precision", escape),
    ):
        numbers.add(macro, formatted(first_value(scaling_runs, column), formatter), source + column)
    measured = runs[runs["stage"].isin(("baseline", "scaling", "sensitivity"))] if runs is not None else None
    numbers.add(
        "StepsPerEpoch",
        formatted(max_value(scaling_runs, "steps_per_epoch"), integer),
        source + "steps_per_epoch (the largest)",
    )
    numbers.add(
        "WindowsUnfilled",
        str(int((measured["window_filled"] == False).sum()))  # noqa: E712 - a column of booleans
        if measured is not None and "window_filled" in measured
        else NOT_MEASURED,
        "runs.csv stage in baseline, scaling, sensitivity: window_filled false",
    )
    scaling = data.table("scaling")
    worlds = sorted({int(w) for w in scaling["world_size"]}) if scaling is not None else []
    numbers.add(
        "ScalingWorldSizes",
        join([str(w) for w in worlds]) if worlds else NOT_MEASURED,
        "scaling.csv world_size",
    )
    numbers.add(
        "ReferenceWorld", str(worlds[0]) if worlds else NOT_MEASURED, "scaling.csv smallest world_size"
    )
    for mode, column in (("Strong", "global_batch"), ("Weak", "per_gpu_batch")):
        rows = scaling[scaling["mode"] == mode.lower()] if scaling is not None else None
        numbers.add(
            f"{mode}Batch",
            formatted(first_value(rows, column), integer),
            f"scaling.csv mode={mode.lower()} {column}",
        )
    repeats = sorted({int(r) for r in scaling["repeats"]}) if scaling is not None else []
    numbers.add(
        "Repeats",
        (str(repeats[0]) if len(repeats) == 1 else f"{repeats[0]} to {repeats[-1]}")
        if repeats
        else NOT_MEASURED,
        "scaling.csv repeats",
    )
    numbers.add("Confidence", percent(0)(data.context["confidence"]), "config: analysis.confidence")


def baseline(numbers: Numbers, data: Data) -> None:
    runs = data.table("runs")
    row = runs[runs["stage"] == "baseline"] if runs is not None else None
    source = "runs.csv stage=baseline " + data.run_ids("baseline") + "; column "
    for macro, column, formatter in (
        ("BaselineThroughput", "images_per_s", lambda v: number(4)(v) + data.per_s),
        ("BaselineEpochTime", "epoch_time_s", seconds),
        ("BaselineStepTime", "step_time_s", seconds),
        ("BaselineBatch", "per_gpu_batch", integer),
        ("BaselineEpochs", "epochs", integer),
        ("BaselineFinalAccuracy", "final_test_acc", percent()),
        ("TargetAccuracy", "target_accuracy", percent(0)),
    ):
        numbers.add(macro, formatted(first_value(row, column), formatter), source + column)
    reached = first_value(row, "time_to_target_s")
    numbers.add(
        "BaselineTimeToTarget",
        seconds(reached)
        if reached is not None
        else (NOT_REACHED if row is not None and len(row) else NOT_MEASURED),
        source + "time_to_target_s",
    )
    numbers.add(
        "BaselineLoader", _loader_words(first_value(row, "config.loader"), data), source + "config.loader"
    )
    numbers.add("BaselineQuality", _quality_sentence(numbers, row, data), source + "final_test_*")
    numbers.add("QualityCaption", _quality_caption(numbers, data), "runs.csv workload (its metric)")


LOADER_WORDS = {"dataloader": "the classic data loader", "tensor": "the in-memory tensor loader"}


def _loader_words(loader, data: Data) -> str:
    """What fed the baseline: the ResNet's loader setting; the LM's token loader; a script's own."""
    if data.words.loader is None:
        return LOADER_WORDS.get(str(loader), "the configured data loader")
    return data.words.loader


def _quality_caption(numbers: Numbers, data: Data) -> str:
    """The caption of figures/accuracy.pdf (scalestudy.plots.curves draws the workload's metric)."""
    if data.metric == "accuracy":
        target = numbers.macros["TargetAccuracy"].value
        text = "Test accuracy per epoch of the scaling runs"
        return text + ("." if target == NOT_MEASURED else f"; the target accuracy is {target}.")
    text = "Test (solid) and training (dashed) loss per epoch of the scaling runs"
    return text + ("; the right axis reads the loss as perplexity." if data.metric == "perplexity" else ".")


ACCURACY_MACROS = ("BaselineFinalAccuracy", "TargetAccuracy", "BaselineTimeToTarget")
NOT_REACHED = "not reached"


def _accuracy_sentence(final: str, target: str, time: str) -> str:
    """How the baseline ends, in each state of its accuracy, target and time to it (measured, not
    measured, not reached)."""
    if final == NOT_MEASURED:
        return "Its test accuracy was not measured."
    ends = f"It ends at {final} test accuracy"
    if target == NOT_MEASURED:  # the target unknown (an older catalog): its time, if any, still tells
        return ends + (
            "." if time in (NOT_MEASURED, NOT_REACHED) else f" and reaches the target accuracy after {time}."
        )
    if time == NOT_REACHED:
        return f"{ends} without reaching the target of {target}."
    if time == NOT_MEASURED:
        return f"{ends}; its time to the target of {target} was not measured."
    return f"{ends} and reaches the target of {target} after {time}."


def _quality_sentence(numbers: Numbers, row: pd.DataFrame | None, data: Data) -> str:
    """How the baseline ends: accuracy and the target (the ResNet), else loss (and perplexity)."""
    if data.metric == "accuracy":
        return _accuracy_sentence(*(numbers.macros[name].value for name in ACCURACY_MACROS))
    loss = formatted(first_value(row, "final_test_loss"), number(3))
    text = f"It ends at a test loss of {loss}"
    if data.metric == "perplexity":
        text += f" (perplexity {formatted(first_value(row, 'final_test_perplexity'), number(3))})"
    return text + "."


SECTIONS = (study, system, method, baseline)
