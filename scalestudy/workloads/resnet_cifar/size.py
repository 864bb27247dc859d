"""The ResNet's closed form for the analysis (its spec's model_size): parameters and forward FLOPs
per image of the CIFAR ResNet-18 of the run's width (scalestudy.analysis.modelsize). Standard
library."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scalestudy.analysis import modelsize


def model_size(run: Mapping[str, Any]) -> tuple[int, float] | None:
    """(parameters, forward FLOPs per image), or None for a run config without its width."""
    width = run.get("width")
    if width is None:
        return None
    return modelsize.parameters(int(width)), modelsize.forward_flops_per_image(int(width))
