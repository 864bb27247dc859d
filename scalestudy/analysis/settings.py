"""The `analysis:` section of the study config, with the defaults of the schema filled in.

The schema (scalestudy.plan.schema) is the one place the defaults live: the Snakefile validates the
whole config against it, and the command-line tools here validate the section they are given the
same way, so running a tool by hand with `--analysis-json '{}'` behaves like the workflow.
"""

from __future__ import annotations

import copy
import logging
from functools import cache
from pathlib import Path
from typing import Any

from scalestudy import commandline
from scalestudy.plan import schema as study_schema
from scalestudy.plan.studyconfig import fill_defaults

log = logging.getLogger("scalestudy.analysis.settings")


@cache
def analysis_schema() -> dict[str, Any]:
    return study_schema.section("analysis")


def with_defaults(analysis: dict[str, Any] | None) -> dict[str, Any]:
    """Validate an `analysis:` section and fill in every default (the input is not modified)."""
    return fill_defaults(copy.deepcopy(analysis or {}), analysis_schema(), "analysis")


DEFAULT_GPUS_PER_NODE = 8


def resolve_gpus_per_node(analysis: dict[str, Any], ranks_per_node: int | None) -> dict[str, Any]:
    """Fill analysis.comm_model.gpus_per_node when it is null: the cluster's ranks per node, else 8
    (a GPU server's usual count, said in the log)."""
    model = analysis["comm_model"]
    if model["gpus_per_node"] is None:
        if not ranks_per_node:
            log.warning(
                "analysis.comm_model.gpus_per_node: no cluster settings given, assuming %d",
                DEFAULT_GPUS_PER_NODE,
            )
        model["gpus_per_node"] = int(ranks_per_node or DEFAULT_GPUS_PER_NODE)
    return analysis


def resolved(analysis: dict[str, Any] | None, ranks_per_node: int | None = None) -> dict[str, Any]:
    """Defaults filled and gpus_per_node resolved: what every analysis step works with."""
    return resolve_gpus_per_node(with_defaults(analysis), ranks_per_node)


def load(analysis_json: str | None = None, config_path: str | Path | None = None) -> dict[str, Any]:
    """The analysis settings from JSON, inline or "@FILE" (what rules pass: gpus_per_node already
    resolved), or a study config file (then the cluster section gives gpus_per_node when it is null)."""
    if analysis_json is not None and config_path is not None:
        raise ValueError("give either --analysis-json or --config, not both")
    if config_path is None:
        return resolved(commandline.json_argument(analysis_json, "--analysis-json") if analysis_json else {})
    import yaml

    from scalestudy.plan import cluster

    config = yaml.safe_load(Path(config_path).read_text()) or {}
    return resolved(config.get("analysis"), cluster.ranks_per_node(config))
