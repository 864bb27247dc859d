"""The study as a Workflow Run RO-Crate (Provenance Run Crate profile): written, checked, validated.

Standard library only here: rules/crate.smk calls rule_specs() for the crate job's parameters.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable


def rule_specs(rules: Iterable, basedir: str) -> str:
    """Every Snakemake rule's output regexes (a job's wildcards from its outputs), benchmark
    pattern, rule file and retries, as the JSON `python -m scalestudy.crate write --rules-json` takes."""
    specs = {
        rule.name: {
            "output": [item.regex().pattern for item in rule.output],
            "benchmark": str(rule.benchmark) if rule.benchmark else None,
            "snakefile": os.path.relpath(rule.snakefile, basedir) if rule.snakefile else None,
            "retries": _retries(rule),
        }
        for rule in rules
    }
    return json.dumps(specs, sort_keys=True)


def _retries(rule) -> int | None:
    """Snakemake's retries of the rule's jobs (0: one attempt each); None where this Snakemake has no
    execution settings to say (`--report`, `--summary`: nothing runs)."""
    try:
        return rule.restart_times
    except AttributeError:
        return None
