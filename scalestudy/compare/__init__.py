"""Two studies compared point by point: ratios with intervals and verdicts.

`python -m scalestudy.compare A B` (compare/__main__.py). Standard library only here: rules/compare.smk
names the other study (default_label) and the file whose change re-runs the comparison (study_file)
when the workflow is parsed.
"""

from __future__ import annotations

from pathlib import Path

RESULTS_FOLDER_NAMES = ("results", "crate")


def study_folder(path: str | Path) -> Path:
    """Where a study lies: its folder, or the folder holding its results/ or crate (absolute)."""
    path = Path(path).resolve()
    path = path.with_suffix("") if path.suffix == ".zip" else path
    while path.name in RESULTS_FOLDER_NAMES and path.parent.name:
        path = path.parent
    return path


def default_label(path: str | Path) -> str:
    """A study's name from where it lies: its folder's, or the folder holding its results/ or crate."""
    return study_folder(path).name


def study_file(path: str | Path) -> list[str]:
    """The file of a study whose change means the study changed: a crate zip itself, a crate's
    metadata or its run catalog; [] where there is none (the comparison then names the problem)."""
    path = Path(path)
    if path.is_file():
        return [str(path)]
    candidates = ("ro-crate-metadata.json", "tables/runs.csv", "results/tables/runs.csv")
    return [str(path / name) for name in candidates if (path / name).is_file()][:1]
