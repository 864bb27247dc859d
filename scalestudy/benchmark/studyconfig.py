"""The study's config files, read the way the Snakefile reads them (schema-validated, defaults filled)."""

from __future__ import annotations

from pathlib import Path

import yaml

from scalestudy.plan import schema

REPO = Path(__file__).resolve().parents[2]
DEMO_CONFIG = REPO / "config" / "demo.yaml"
STUDY_CONFIG = REPO / "config" / "config.yaml"


def load_config(configfile: str | Path = DEMO_CONFIG) -> dict:
    from snakemake.utils import validate

    config = yaml.safe_load(Path(configfile).read_text())
    validate(config, schema.PATH)
    return config
