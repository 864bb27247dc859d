"""The constructed GPU study of the paper's tests (test_paper_draft.py, test_paper_pdf.py) and what they
read besides: its analysis tables and numbers (module-scoped fixtures), the template, the bibliography and
the context of the numbers."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from scalestudy.analysis import acceptance, commmodel, metrics, resources, settings
from scalestudy.analysis.constructed_study import run_row
from scalestudy.paper import numbers
from scalestudy.paper.macros import Numbers
from tests.conftest import REPO

SETTINGS = settings.resolved({})
TEMPLATE = REPO / "report" / "paper" / "template.tex"
BIB = REPO / "report" / "paper" / "references.bib"
CONTEXT = {"title": "A test study", "data_source": "cifar10", "device": "cuda", "confidence": 0.95}


# --------------------------------------------------------------------------- a constructed study
def strong_step(world: int) -> float:
    """Strong scaling at 80 % efficiency beyond one GPU: a known answer."""
    return 0.2 if world == 1 else 0.2 / (0.8 * world)


@pytest.fixture(scope="module")
def study_tables() -> dict[str, pd.DataFrame]:
    """The analysis tables of a small constructed GPU study (strong to 4 GPUs, weak to 2)."""
    rows = [run_row("baseline", 1, 128, 0.16, **{"config.width": 64})]
    rows += [run_row("scaling", n, 1024 // n, strong_step(n), mode="strong") for n in (1, 2, 4)]
    rows += [
        run_row("scaling", n, 256, 0.1 * (1 + 0.01 * r) * (1 if n == 1 else 1.1), mode="weak", repeat=r)
        for n in (1, 2)
        for r in range(2)
    ]
    rows += [
        run_row("sensitivity", 2, b, b / ips, **{"config.precision": p, "config.bucket_cap_mb": 25})
        for p, b, ips in (("fp32", 64, 800.0), ("bf16", 128, 1500.0))
    ]
    runs = pd.DataFrame(rows)
    runs.loc[runs["stage"] == "sensitivity", "point"] = ["fp32/bs64_bucket25", "bf16/bs128_bucket25"]
    runs["hosts"] = "gpu01"
    runs["backend"] = "nccl"
    per_run = metrics.run_metrics(runs, SETTINGS)
    scaling = metrics.scaling_table(per_run, SETTINGS)
    sweep = metrics.sensitivity_table(per_run)
    fit, _, prediction = commmodel.analyse(runs, SETTINGS)
    return {
        "runs": runs,
        "scaling": scaling,
        "sensitivity": sweep,
        "acceptance": acceptance.evaluate(scaling, sweep, SETTINGS["acceptance"]),
        "resources": resources.estimate(runs, scaling, prediction, SETTINGS),
        "comm_fit": fit,
        "comm_prediction": prediction,
        "profile_breakdown": pd.DataFrame(
            [
                {
                    "world_size": 2,
                    "rank": r,
                    "tool": "nsys",
                    "category": c,
                    "fraction": f,
                    "time_per_step_s": f * 0.1,
                }
                for r in (0, 1)
                for c, f in (
                    ("conv_gemm", 0.6),
                    ("communication", 0.25),
                    ("data_loading", 0.05),
                    ("idle_other", 0.1),
                )
            ]
        ),
        "profile_overlap": pd.DataFrame([{"world_size": 2, "rank": 0, "overlap_fraction": 0.5}]),
    }


@pytest.fixture(scope="module")
def study_numbers(study_tables) -> Numbers:
    return numbers.build(study_tables, CONTEXT)


def write_numbers(folder: Path, built: Numbers) -> Path:
    path = folder / "numbers.tex"
    path.write_text(built.render())
    return path
