"""The study config files the benchmarks read (as the Snakefile reads them: scalestudy.plan.studyconfig)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEMO_CONFIG = REPO / "config" / "demo.yaml"
STUDY_CONFIG = REPO / "config" / "config.yaml"
