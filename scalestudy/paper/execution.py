"""The macros that say how the study ran (scalestudy.analysis.execution, from runs.csv's Slurm job ids
and system.csv's Slurm version): where it scaled (\\StudyWhere, the abstract), which of Snakemake's
executors ran it (\\SnakemakeExecutor, the software list), the sentence of the system section
(\\Executed), what every result row's provenance holds (\\ProvenanceList) and the batch system's
energy accounting (\\AccountedEnergy). A study that Slurm did not run names no Slurm anywhere.
"""

from __future__ import annotations

import re

from scalestudy.analysis.execution import UNKNOWN
from scalestudy.paper.macros import Numbers
from scalestudy.paper.sections import Data
from scalestudy.paper.tables import escape

SOURCE = "runs.csv job ids (Slurm's where it ran), system.csv slurm"
PROVENANCE = "the run configuration and its hash, the seed, the git commit, the package versions"


def cited(text: str) -> str:
    """The text for LaTeX: Snakemake's Slurm executor plugin cited where named, and Slurm itself
    where first named apart from it."""
    text = re.sub(r"\bSlurm\b(?! executor plugin)", lambda _: r"Slurm~\cite{slurm}", escape(text), count=1)
    return text.replace("Slurm executor plugin", r"Slurm executor plugin~\cite{snakemakeslurm}", 1)


def execution(numbers: Numbers, data: Data) -> None:
    ran = data.execution
    source = f"{SOURCE}: executor {ran.executor}, {ran.slurm_runs} of {ran.runs} runs under Slurm"
    numbers.add("StudyWhere", escape(ran.where()), source)
    numbers.add("SnakemakeExecutor", cited(ran.snakemake_executor()), source)
    numbers.add("Executed", cited(ran.sentence(where=False)), source)
    numbers.add(
        "ProvenanceList",
        f"{PROVENANCE}, the hosts and the Slurm job" if ran.slurm else f"{PROVENANCE} and the hosts",
        source,
    )
    sacct = numbers.macros["SacctEnergy"].value  # scalestudy.paper.energy's
    accounted = {
        True: f"Slurm's own energy accounting of the jobs: {sacct}.",
        False: "No batch system accounted the jobs' energy: Snakemake's local executor ran them.",
    }[ran.slurm]
    if ran.executor == UNKNOWN:
        accounted = "No run recorded a batch system's energy accounting."
    numbers.add("AccountedEnergy", accounted, source + "; runs.csv sacct.energy_consumed_j")


SECTIONS = (execution,)
