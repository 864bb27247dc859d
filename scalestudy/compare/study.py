"""One side of a comparison: a study's runs, from its results/ folder or from its crate.

A study is found as (first match): `<path>/tables/runs.csv` (a results/ folder),
`<path>/results/tables/runs.csv` (a workflow folder, or an unpacked crate), or a crate zip. A crate is
checked first (scalestudy.crate.check): a file missing or changed since the crate was written stops
the comparison, naming the file. A study's name (its label, unless one is given) is config study.name
as its crate records it (the crate, or the crate/ beside its results), else its folder's. Two studies
of the same name are told apart (`distinguish`) by the first of their commit, the dates their runs
started and their folder that differs.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from scalestudy.analysis import metrics
from scalestudy.analysis.tableio import read_csv
from scalestudy.compare import default_label, study_folder
from scalestudy.crate import check
from scalestudy.plan import paths

RUNS_CSV = "tables/runs.csv"
TIMESTAMP = "provenance.timestamp"  # when a run started (ISO 8601)
# Provenance columns of runs.csv that tell two studies apart: the comparison's axis is among them.
PROVENANCE_AXES = {
    "commit": "provenance.git_commit",
    "partition": "provenance.slurm.job_partition",
    "cluster": "provenance.slurm.cluster_name",
    "device": "device_name",
    "hosts": "hosts",
    "image": "provenance.image_sha256",
    "torch": "provenance.versions.torch",
    "cuda": "provenance.versions.cuda",
    "nccl": "provenance.versions.nccl",
}


@dataclass
class Study:
    label: str
    source: str
    runs: pd.DataFrame  # runs.csv with metrics.run_metrics' columns (time per step, efficiency, ...)

    def distinct(self, column: str) -> list[str]:
        if column not in self.runs:
            return []
        values = self.runs[column].dropna().astype(str)
        return sorted(set(values) - {"", "nan", "None"})

    def traits(self) -> dict[str, str]:
        """What tells this study from another of its name: commit(s), the days its runs started, folder."""
        days = sorted({value[:10] for value in self.distinct(TIMESTAMP)})
        return {
            "commit": ",".join(commit[:7] for commit in self.distinct(PROVENANCE_AXES["commit"])),
            "run": " to ".join(dict.fromkeys([days[0], days[-1]])) if days else "",
            "folder": str(study_folder(self.source)),
        }


def distinguish(a: Study, b: Study) -> tuple[str, str]:
    """The two labels, each with the first trait (commit, run dates, folder) that differs where the
    names are the same: "demo [commit 1a2b3c4]" against "demo [commit 5d6e7f8]"."""
    if a.label != b.label:
        return a.label, b.label
    traits_a, traits_b = a.traits(), b.traits()
    for trait in ("commit", "run"):
        if traits_a[trait] and traits_b[trait] and traits_a[trait] != traits_b[trait]:
            return f"{a.label} [{trait} {traits_a[trait]}]", f"{b.label} [{trait} {traits_b[trait]}]"
    folder_a, folder_b = Path(traits_a["folder"]), Path(traits_b["folder"])
    if folder_a == folder_b:
        return a.label, b.label
    short_a, short_b = (
        (folder_a.name, folder_b.name) if folder_a.name != folder_b.name else (folder_a, folder_b)
    )
    return f"{a.label} [folder {short_a}]", f"{b.label} [folder {short_b}]"


def runs_csv(folder: Path) -> Path:
    for candidate in (folder / RUNS_CSV, folder / paths.RESULTS_DIR / RUNS_CSV):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"{folder}: no run catalog ({folder / RUNS_CSV} or {folder / paths.RESULTS_DIR / RUNS_CSV}):"
        " give a study's results/ folder, its workflow folder or its crate"
    )


@contextlib.contextmanager
def opened(path: str | os.PathLike) -> Iterator[Path]:
    """The study's folder, its crate checked (and a zip unpacked) first."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such study (a results/ folder or a crate)")
    if check.is_crate(path):
        with check.opened(path) as crate_dir:
            check.verify(crate_dir)
            yield crate_dir
    else:
        yield path


def study_name(folder: Path) -> str | None:
    """The study's name (config study.name) as its crate records it, in the crate's effective config
    (the crate, or the crate/ beside a study's results); None where there is none."""
    from scalestudy.crate.write import CONFIG_JSON

    for crate_dir in (folder, folder / Path(paths.CRATE_DIR).name, folder / paths.CRATE_DIR):
        if (crate_dir / check.METADATA).is_file() and (crate_dir / CONFIG_JSON).is_file():
            try:
                name = (json.loads((crate_dir / CONFIG_JSON).read_text()).get("study") or {}).get("name")
            except (ValueError, AttributeError):
                return None
            return name if isinstance(name, str) and name.strip() else None
    return None


def load(path: str | os.PathLike, settings: dict, label: str | None = None) -> Study:
    """A study's runs with the derived metrics (throughput, time per step, efficiency, ...)."""
    with opened(path) as folder:
        csv = runs_csv(folder)
        runs = metrics.run_metrics(read_csv(csv), settings, str(csv))
        name = label or study_name(folder) or default_label(Path(path))
    return Study(name, str(path), runs)


def clean(value):
    """A config cell as a comparable value: NaN and empty are None, 2.0 is 2."""
    if value is None or (isinstance(value, float) and math.isnan(value)) or value == "":
        return None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value
