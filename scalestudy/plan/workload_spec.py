"""What a workload is, as data: the classes of the `SPEC` each workload package holds
(scalestudy/workloads/<name>/spec.py), collected by the registry scalestudy.plan.workloads.
Standard library only: the Snakefile reads the specs when it parses the workflow, so the parts that
import torch (the model and data builders, the data-fit check, a workload's own entry) are module
paths, resolved when a rank runs (`resolve`)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from scalestudy.plan.paths import PACKED_DIR, RAW_DATA_DIR

# The data.source that makes a workload's data offline (every other source fetches a file).
GENERATED_SOURCE = "synthetic"


@dataclass(frozen=True)
class DataKind:
    """The data a workload reads and how the workflow makes it: the file fetch writes (under
    RAW_DATA_DIR), the packed files preprocess writes (under PACKED_DIR, manifest.json last), the
    data.source values it can be made from (empty: any), and its two jobs (rules/fetch.smk,
    rules/preprocess.smk), each one command:

        python -m <fetch> --source <S> --out <raw file> <ARGS>
        python -m <preprocess> --<raw_option> <raw file> --out-dir <packed folder> [--<option> <value>]...

    where (S, [ARGS]) = fetch_args(config) and {option: value} = preprocess_options(config) (an
    option's name with - for _), both "module:function" paths of standard-library functions of the
    study config (the Snakefile calls them when it parses the workflow)."""

    name: str
    raw_file: str | None  # under RAW_DATA_DIR; None: the workload brings its own data
    packed_files: tuple[str, ...]  # under PACKED_DIR, manifest.json last
    sources: tuple[str, ...] = ()
    fetch: str = "scalestudy.data.fetch"
    fetch_args: str | None = None
    preprocess: str | None = None
    raw_option: str = "archive"
    preprocess_options: str | None = None
    # data.url, md5 and size_bytes default to this kind's file (CIFAR-10's archive); another kind
    # fetched from a URL must be given its own (scalestudy.plan.configcheck)
    default_download: bool = False

    @property
    def raw_path(self) -> str | None:
        return f"{RAW_DATA_DIR}/{self.raw_file}" if self.raw_file else None

    @property
    def packed_paths(self) -> list[str]:
        return [f"{PACKED_DIR}/{name}" for name in self.packed_files]

    def fetch_command(self, config: Mapping[str, Any]) -> tuple[str, list[Any]]:
        """(--source, the arguments after --out) of the fetch job."""
        return resolve(self.fetch_args)(config) if self.fetch_args else (config["data"]["source"], [])

    def preprocess_command(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """{option: value} of the preprocess job beyond its input and output."""
        return resolve(self.preprocess_options)(config) if self.preprocess_options else {}


NO_DATA = DataKind("none", None, ())


@dataclass(frozen=True)
class PaperWords:
    """How the paper (scalestudy.paper.sections) names the workload's data, model and loader."""

    dataset: str  # \DatasetName
    data_real: str  # \DataSource, fetched data
    data_synthetic: str  # \DataSource, generated offline
    subject: str  # what numbers on synthetic data say nothing about
    model: str  # \ModelName before its details
    # the details: a format string over runs.csv columns (numbers as integers, text escaped), left out
    # unless every column has a value
    model_details: str = ""
    model_columns: tuple[tuple[str, str], ...] = ()  # (format field, runs.csv column)
    cite: str = ""  # \ModelCite
    batch_items: str = "samples"  # what a batch counts
    loader: str | None = None  # what fed the baseline; None: the run config's `loader` setting


# The words for a workload that names none of its own (the user's script), and for an unknown name.
SCRIPT_WORDS = PaperWords(
    dataset="the training script's data",
    data_real="the data the training script reads itself",
    data_synthetic="the data the training script reads itself",
    subject="the model's quality",
    model="the user's training script",
    model_details=r" \texttt{{{script}}}",
    model_columns=(("script", "config.command.script"),),
    loader="the script's own data loading",
)


@dataclass(frozen=True)
class WorkloadSpec:
    name: str  # workload.name in the config (the schema's enum lists it too)
    sample_unit: str  # what throughput counts: images, tokens, samples
    metric: str  # the quality metric reported besides the loss: accuracy, perplexity, none
    data: DataKind
    model_keys: tuple[str, ...]  # config["model"] keys copied into every run config
    reshardable: bool  # checkpoints resume at another world size (same global batch)
    runtime: str  # module with build_data(config, rank, world_size, device) and build_model(config, device)
    default_optimizer: str | None = "sgd"  # the optimizer when train.optimizer is null; None: the script's
    parallelisms: tuple[str, ...] = ("ddp", "fsdp")  # what it may train with; empty: its script's own
    model_sections: tuple[str, ...] = ()  # the model_keys that are sections (a dict, not one value)
    # "module:function" (config) -> None or (have, unit words, need, per words): how many of a rank's
    # batches the data holds (scalestudy.train.datafit); None: not checked
    batch_fit: str | None = None
    # "module:function" (config, given, out_dir, dist_env) -> exit code: the workload runs each rank
    # itself instead of the trainer; None: scalestudy.train.trainer
    entry: str | None = None
    # The config's `workload.<name>` section goes into every run config as `<name>`: the module (standard
    # library) whose problems(section) -> [str] and filled(section) -> dict check it and fill in its
    # defaults (scalestudy.plan.runconfig.validate); None: no such section. The section's keys that
    # must be given (key, what it is), and those that name a file every training job reads.
    run_section: str | None = None
    section_required: tuple[tuple[str, str], ...] = ()
    section_files: tuple[str, ...] = ()
    paper: PaperWords = field(default=SCRIPT_WORDS)
    # train.<key> settings its runs would ignore, (key, why): the config check refuses one that is set
    # (train.<key> not null, or a sensitivity axis), naming it, rather than run a study that ignores it
    ignores: tuple[tuple[str, str], ...] = ()
    # "module:function" (study config) -> the training samples of an epoch in what per_gpu_batch
    # counts, or None where only preprocessing or the script can tell (standard library: the grid
    # plans with it); None: never known before the run
    samples_per_epoch: str | None = None
    # "module:function" (run config) -> (parameters, forward FLOPs per sample) of the model's closed
    # form, or None where the run config lacks what it needs (standard library: the analysis's MFU
    # and communication model); None: the analysis uses what the trainer counted
    model_size: str | None = None

    def with_unit(self, unit: str) -> WorkloadSpec:
        return WorkloadSpec(**{**self.__dict__, "sample_unit": unit})

    def runtime_module(self) -> ModuleType:
        """The module with build_data and build_model (imports torch)."""
        return importlib.import_module(self.runtime)

    def epoch_samples(self, config: Mapping[str, Any]) -> int | None:
        return resolve(self.samples_per_epoch)(config) if self.samples_per_epoch else None

    def closed_form(self, run: Mapping[str, Any]) -> tuple[int, float] | None:
        return resolve(self.model_size)(run) if self.model_size else None


def resolve(path: str) -> Callable[..., Any]:
    """The function of a "module:function" path (imports the module: may import torch)."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)
