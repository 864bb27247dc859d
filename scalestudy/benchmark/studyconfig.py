"""The study's config files, read the way the Snakefile reads them (schema-validated, defaults filled)."""

from __future__ import annotations

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
SCHEMA = REPO / "config" / "schema.yaml"
DEMO_CONFIG = REPO / "config" / "demo.yaml"
STUDY_CONFIG = REPO / "config" / "config.yaml"


def load_config(configfile: str | Path = DEMO_CONFIG) -> dict:
    from snakemake.utils import validate

    config = yaml.safe_load(Path(configfile).read_text())
    validate(config, str(SCHEMA))
    return config
