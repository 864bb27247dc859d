"""What the workflow asks of the LM's data (its spec's data kind): the fetch job's arguments, the
tokenize job's options and the sequences of an epoch. Standard library: the Snakefile calls these
when it parses the workflow."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scalestudy.data.fetch import download_args
from scalestudy.plan import schema
from scalestudy.plan.workload_spec import GENERATED_SOURCE
from scalestudy.workloads.gpt import presets


def fetch_args(config: Mapping[str, Any]) -> tuple[str, list[str]]:
    """The corpus generated offline (scalestudy.data.synthetic_text), or downloaded."""
    data = config["data"]
    if data["source"] == GENERATED_SOURCE:
        synthetic = data["synthetic_text"]
        return "synthetic-text", ["--text-bytes", str(synthetic["bytes"]), "--seed", str(synthetic["seed"])]
    return "text", download_args(data)


def seq_len(config: Mapping[str, Any]) -> int:
    """The LM's sequence length: model.gpt.seq_len, else its preset's."""
    return presets.seq_len(config["model"].get("gpt"))


def preprocess_options(config: Mapping[str, Any]) -> dict[str, Any]:
    """scalestudy.data.tokenize's options: the test split's share, and the sequence length each split
    must hold once."""
    return {"test_fraction": config["data"]["test_fraction"], "seq_len": seq_len(config)}


def samples_per_epoch(config: Mapping[str, Any]) -> int | None:
    """The sequences (windows of seq_len + 1 tokens) of the synthetic corpus's training share (one
    token per byte); None for a downloaded corpus (only tokenizing tells)."""
    if config["data"]["source"] != GENERATED_SOURCE:
        return None
    corpus = schema.setting(config, "data", "synthetic_text", "bytes")
    test_fraction = schema.setting(config, "data", "test_fraction")
    return int(corpus * (1 - test_fraction)) // (seq_len(config) + 1)
