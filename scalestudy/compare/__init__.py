"""Two studies compared point by point: ratios with intervals and verdicts.

`python -m scalestudy.compare A B` (compare/__main__.py). Standard library only here: the Snakefile
names the other study with default_label() when it parses the workflow.
"""

from __future__ import annotations

from pathlib import Path

RESULTS_FOLDER_NAMES = ("results", "crate")


def default_label(path: str | Path) -> str:
    """A study's name from where it lies: its folder's, or the folder holding its results/ or crate."""
    path = Path(path).resolve()
    path = path.with_suffix("") if path.suffix == ".zip" else path
    while path.name in RESULTS_FOLDER_NAMES and path.parent.name:
        path = path.parent
    return path.name
