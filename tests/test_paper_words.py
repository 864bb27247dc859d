"""The paper says only what happened, in English, in every state of its numbers: every macro built
from a measured study, from one whose baseline did not reach its target and whose criteria the grid
does not reach, and from no tables at all reads without a verdict said twice ("not measured, not
measured") or a time that is none ("after not reached"); the template's text, macros expanded, does
too; and the executor that ran the study is the one the paper names: Slurm only where Slurm ran it.
(The demo's own paper and report: tests/test_workflow.py; through Slurm: tests/test_slurm.py.)"""

from __future__ import annotations

import re

import pandas as pd
import pytest

from scalestudy.analysis import execution
from scalestudy.paper import numbers
from tests.conftest import REPO
from tests.paper_study import CONTEXT, study_tables  # noqa: F401 - a fixture
from tests.paper_text import broken, expanded, sentences

TEMPLATE = (REPO / "report/paper/template.tex").read_text()


def not_reached(tables: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """The study's tables with a baseline that never reached the target accuracy."""
    runs = tables["runs"].copy()
    runs.loc[runs["stage"] == "baseline", "time_to_target_s"] = float("nan")
    return {**tables, "runs": runs}


def under_slurm(tables: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """The study's tables as Slurm would have run them: a job per run, sinfo's version."""
    runs = tables["runs"].assign(job_id=[str(7000 + i) for i in range(len(tables["runs"]))])
    system = pd.DataFrame([{"host": "gpu01", "slurm": "slurm 23.11.4"}])
    return {**tables, "runs": runs.assign(**{"provenance.slurm.cluster_name": "hpc"}), "system": system}


def measured(tables: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """The constructed study's tables with what every run of the workflow records besides: its
    measurement window and contention check, one machine's description, no batch job."""
    window = {"warmup_steps": 5, "measure_steps": 16, "steps_per_epoch": 25, "window_filled": True}
    window |= {"contended": False, "contention_checked": True, "target_accuracy": 0.8}
    system = pd.DataFrame([{"host": "gpu01", "cpu_model": "EPYC", "cores": 64, "slurm": "none"}])
    return {**tables, "runs": tables["runs"].assign(**window), "system": system}


@pytest.fixture(scope="module")
def states(study_tables) -> dict[str, dict[str, str]]:  # noqa: F811
    """{state: {macro: value}} of the paper's numbers in each state."""
    tables = {
        "measured": measured(study_tables),
        "not reached": not_reached(measured(study_tables)),
        "not measured": {},
        "under Slurm": under_slurm(measured(study_tables)),
    }
    return {
        state: {name: macro.value for name, macro in numbers.build(given, CONTEXT).macros.items()}
        for state, given in tables.items()
    }


@pytest.mark.parametrize("state", ["measured", "not reached", "not measured", "under Slurm"])
def test_every_macro_reads_as_english_in_each_state(states, state):
    problems = {name: broken(value) for name, value in states[state].items() if broken(value)}
    assert not problems, problems


@pytest.mark.parametrize("state", ["measured", "not reached", "under Slurm"])
def test_the_papers_text_reads_as_english_in_each_state(states, state):
    """The template's sentences with the macros in place (the tables \\input beside them aside)."""
    problems = [(sentence, broken(sentence)) for sentence in sentences(expanded(TEMPLATE, states[state]))]
    assert not [problem for problem in problems if problem[1]]


def test_the_baseline_and_the_criteria_in_words(states):
    measured, missed, nothing = states["measured"], states["not reached"], states["not measured"]
    assert re.fullmatch(
        r"It ends at [\d.]+\\,\\% test accuracy and reaches the target of [\d.]+\\,\\% after [\d.{,}]+~s\.",
        measured["BaselineQuality"],
    ), measured["BaselineQuality"]
    assert re.fullmatch(
        r"It ends at [\d.]+\\,\\% test accuracy without reaching the target of [\d.]+\\,\\%\.",
        missed["BaselineQuality"],
    ), missed["BaselineQuality"]
    assert nothing["BaselineQuality"] == "Its test accuracy was not measured."
    assert nothing["QualityCaption"] == "Test accuracy per epoch of the scaling runs."
    # the grid stops at 4: the criterion at 8 says so once, a measured one gives value and verdict
    assert r"(target $\geq$ 70\,\%): \emph{not measured (largest N=4)}." in measured["AcceptanceList"]
    assert re.search(
        r"\(target \$\\geq\$ 20\\,\\%\): [\d.]+\\,\\%, \\emph\{pass\}", measured["AcceptanceList"]
    )


def test_the_paper_names_slurm_only_where_slurm_ran_the_study(states):
    """A study whose runs carry no Slurm job says so and names no Slurm (not in the abstract, the
    software list, the provenance or the energy); one Slurm ran says it, with its version."""
    for state in ("measured", "not reached", "not measured"):
        text = expanded(TEMPLATE, states[state])
        assert "slurm" not in text.lower(), [s for s in sentences(text) if "slurm" in s.lower()]
    local = expanded(TEMPLATE, states["measured"])
    assert "scales\non one machine," in local or "scales on one machine," in " ".join(local.split())
    assert "Snakemake's local executor ran every job of this study; no batch system was involved" in local
    slurm = " ".join(expanded(TEMPLATE, states["under Slurm"]).split())
    assert "scales on a Slurm cluster," in slurm
    assert (
        r"Slurm~\cite{slurm} (version 23.11.4, cluster hpc) ran the 10 training runs as 10 Slurm jobs,"
        r" submitted by Snakemake's Slurm executor plugin~\cite{snakemakeslurm}." in slurm
    )
    assert r"with its Slurm executor plugin~\cite{snakemakeslurm}" in slurm
    assert "the package versions, the hosts and the Slurm job" in slurm
    assert "Slurm's own energy accounting of the jobs:" in slurm


@pytest.mark.parametrize(
    ("jobs", "executor"),
    [
        ([None, None, None], execution.LOCAL),
        (["11", "12", "13"], execution.SLURM),
        (["11.0", "11.1", "11.2"], execution.ALLOCATION),  # steps of one allocation
        (["11", None, None], execution.MIXED),
    ],
)
def test_the_executor_is_read_from_the_runs_job_ids(jobs, executor):
    runs = pd.DataFrame({"job_id": jobs, "hosts": ["n1", "n1,n2", "n2"], "device": "cpu"})
    ran = execution.describe(runs)
    assert (ran.executor, ran.slurm, ran.hosts) == (executor, executor != execution.LOCAL, ("n1", "n2"))
    assert ("Slurm" in ran.sentence()) == ran.slurm and ("Slurm" in ran.where()) == ran.slurm
