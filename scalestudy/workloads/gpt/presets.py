"""The LM's model presets (model.gpt.preset) and the sequence length they give. Standard library:
the grid and the preprocess rule read them when the Snakefile parses the workflow."""

from __future__ import annotations

from typing import Any

from scalestudy.plan import schema

PRESETS: dict[str, dict[str, Any]] = {
    # ~1.9 M parameters: trains on a CPU in the offline demo (byte vocabulary)
    "demo": {"vocab_size": 256, "seq_len": 128, "layers": 4, "heads": 4, "d_model": 192},
    # GPT-2 small (124 M parameters; the vocabulary padded to 50304 as nanoGPT does)
    "gpt2-small": {"vocab_size": 50304, "seq_len": 1024, "layers": 12, "heads": 12, "d_model": 768},
}


def seq_len(section: dict[str, Any] | None) -> int:
    """The sequence length of a `model.gpt` / run-config `gpt` section: its own, else its preset's
    (the schema's default preset where it names none)."""
    section = section or {}
    preset = section.get("preset") or schema.node("model", "gpt", "preset")["default"]
    return section.get("seq_len") or PRESETS[preset]["seq_len"]
