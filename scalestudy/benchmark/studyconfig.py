"""The study's config files, read the way the Snakefile reads them (schema-validated, defaults filled)."""

from __future__ import annotations

from pathlib import Path

from scalestudy.analysis.settings import study_config

REPO = Path(__file__).resolve().parents[2]
DEMO_CONFIG = REPO / "config" / "demo.yaml"
STUDY_CONFIG = REPO / "config" / "config.yaml"


def load_config(configfile: str | Path = DEMO_CONFIG) -> dict:
    """Validated with its defaults filled in by jsonschema alone: a GPU node needs no Snakemake."""
    return study_config(configfile)
