"""The workload registry: what a study can train. One entry per workload, pure standard library (the
Snakefile imports this when it parses the workflow); the code that builds a workload's model and data
is its own package under scalestudy/workloads/ (scalestudy.workloads.runtime()).

Every rank runs `python -m scalestudy.train` whatever the workload (a command workload's run config
it hands to scalestudy.train.command). A workload says the unit it counts throughput in, its quality
metric, which fetched and packed data files it needs, and which keys of the config's `model:` section
go into its run configs.

    resnet18-cifar10  the reference study: ResNet-18 (CIFAR stem) on CIFAR-10, images
    gpt               a GPT-style decoder LM on a byte-tokenised text corpus, tokens
    command           the user's own training script (scalestudy.train.command.runner), in its unit
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from scalestudy.plan.paths import PACKED_DIR, RAW_DATA_DIR

DEFAULT = "resnet18-cifar10"


@dataclass(frozen=True)
class DataKind:
    """The data a workload reads: the fetched file, and the packed files preprocessing writes."""

    name: str
    raw_file: str | None  # under RAW_DATA_DIR; None: the workload brings its own data
    packed_files: tuple[str, ...]  # under PACKED_DIR, manifest.json last

    @property
    def raw_path(self) -> str | None:
        return f"{RAW_DATA_DIR}/{self.raw_file}" if self.raw_file else None

    @property
    def packed_paths(self) -> list[str]:
        return [f"{PACKED_DIR}/{name}" for name in self.packed_files]


CIFAR10 = DataKind(
    "cifar10",
    "cifar-10-python.tar.gz",
    tuple(f"{split}_{kind}.npy" for split in ("train", "test") for kind in ("images", "labels"))
    + ("manifest.json",),
)
TEXT = DataKind("text", "corpus.txt", ("train_tokens.npy", "test_tokens.npy", "manifest.json"))
NO_DATA = DataKind("none", None, ())


@dataclass(frozen=True)
class Workload:
    name: str
    sample_unit: str  # what throughput counts: images, tokens, samples
    metric: str  # the quality metric reported besides the loss: accuracy, perplexity, none
    data: DataKind
    model_keys: tuple[str, ...]  # config["model"] keys copied into every run config
    reshardable: bool  # checkpoints resume at another world size (same global batch)


WORKLOADS: dict[str, Workload] = {
    "resnet18-cifar10": Workload(
        "resnet18-cifar10",
        "images",
        "accuracy",
        CIFAR10,
        ("width", "channels_last", "compile"),
        False,
    ),
    "gpt": Workload("gpt", "tokens", "perplexity", TEXT, ("gpt", "compile"), True),
    "command": Workload("command", "samples", "none", NO_DATA, (), False),
}


GPT_PRESETS: dict[str, dict[str, Any]] = {
    # ~1.9 M parameters: trains on a CPU in the offline demo (byte vocabulary)
    "demo": {"vocab_size": 256, "seq_len": 128, "layers": 4, "heads": 4, "d_model": 192},
    # GPT-2 small (124 M parameters; the vocabulary padded to 50304 as nanoGPT does)
    "gpt2-small": {"vocab_size": 50304, "seq_len": 1024, "layers": 12, "heads": 12, "d_model": 768},
}


def gpt_seq_len(section: dict[str, Any] | None) -> int:
    """The sequence length of a `model.gpt` / run-config `gpt` section: its own, else its preset's."""
    section = section or {}
    return section.get("seq_len") or GPT_PRESETS[section.get("preset") or "demo"]["seq_len"]


def get(name: str) -> Workload:
    try:
        return WORKLOADS[name]
    except KeyError:
        raise ValueError(f"unknown workload {name!r}: one of {', '.join(WORKLOADS)}") from None


def of_config(config: dict[str, Any]) -> Workload:
    """The study config's workload (`workload.name`, default resnet18-cifar10); a command workload
    counts in the unit its config names (`workload.command.sample_unit`)."""
    section = config.get("workload") or {}
    workload = get(section.get("name", DEFAULT))
    if workload.name == "command":
        unit = (section.get("command") or {}).get("sample_unit", workload.sample_unit)
        workload = Workload(**{**workload.__dict__, "sample_unit": unit})
    return workload
