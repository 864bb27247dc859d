"""How the study ran, from what its runs recorded (runs.csv's Slurm job ids, system.csv's Slurm
version): which executor ran its jobs, where, and under which batch system, so that the paper
(scalestudy.paper.execution) and the report (REPORT_TEXT, included by report/*.rst) say what happened
and nothing else: no cluster for a run on one machine, a Slurm version only where Slurm ran.

- `local`: no run has a Slurm job id: Snakemake's local executor ran every job (the demo);
- `slurm`: every run has its own Slurm job (Snakemake's Slurm executor plugin submitted them);
- `allocation`: the runs share one Slurm job: steps of one allocation (profiles/slurm-allocation,
  Snakemake's local executor inside it);
- `mixed`: some runs under Slurm, some not (a study resumed elsewhere);
- `unknown`: no run recorded (no run catalog).

The report's captions are reStructuredText: this module writes their words as substitutions
(`.. |executed| replace:: ...`) into REPORT_TEXT, which each caption includes.

    python -m scalestudy.analysis.execution --runs results/tables/runs.csv \
        [--system results/tables/system.csv] --out results/report/executed.rst
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from scalestudy import atomic
from scalestudy.analysis import cli
from scalestudy.analysis.tableio import read_csv
from scalestudy.plan import paths

REPORT_TEXT = paths.REPORT_TEXT
LOCAL, SLURM, ALLOCATION, MIXED, UNKNOWN = "local", "slurm", "allocation", "mixed", "unknown"
JOB_COLUMNS = ("job_id", "provenance.slurm.job_id", "provenance.slurm_job_id")  # the first one found
NONE = ("", "none", "nan")  # what system.csv writes where a host has no Slurm


@dataclass(frozen=True)
class Execution:
    """What ran the study's training runs (runs.csv) and where."""

    executor: str  # LOCAL, SLURM, ALLOCATION, MIXED or UNKNOWN
    runs: int
    slurm_runs: int  # runs with a Slurm job id
    slurm_jobs: tuple[str, ...]  # their distinct job ids
    slurm_versions: tuple[str, ...]  # system.csv's (23.11.4), where Slurm ran
    clusters: tuple[str, ...]
    hosts: tuple[str, ...]
    devices: tuple[str, ...] = ()  # runs.csv device_name: what one rank drove
    on_gpu: bool = False

    @property
    def slurm(self) -> bool:
        return self.slurm_runs > 0

    def where(self) -> str:
        """Where the study scaled, for the abstract: 'on a Slurm cluster', 'on one machine', ..."""
        if self.executor == UNKNOWN:
            return "(no run recorded where)"
        if not self.slurm:
            return "on one machine" if len(self.hosts) <= 1 else f"on {len(self.hosts)} machines"
        return "in one Slurm allocation" if self.executor == ALLOCATION else "on a Slurm cluster"

    def snakemake_executor(self) -> str:
        """Which of Snakemake's executors ran the jobs: 'its local executor', ..."""
        return {
            LOCAL: "its local executor",
            SLURM: "its Slurm executor plugin",
            ALLOCATION: "its local executor inside one Slurm allocation",
            MIXED: "its Slurm executor plugin for some jobs and its local executor for the others",
            UNKNOWN: "an executor no run recorded",
        }[self.executor]

    def slurm_detail(self) -> str:
        """'version 23.11.4, cluster linux' (what is known of the Slurm that ran the jobs), or ''."""
        parts = [f"version {', '.join(self.slurm_versions)}"] if self.slurm_versions else []
        parts += [f"cluster {', '.join(self.clusters)}"] if self.clusters else []
        return ", ".join(parts)

    def ranks(self) -> str:
        """'each rank on a GPU (NVIDIA H100 80GB HBM3)', or on a CPU."""
        names = f" ({', '.join(self.devices)})" if self.devices else ""
        return f"each rank on {'a GPU' if self.on_gpu else 'a CPU'}{names}"

    def sentence(self, where: bool = True) -> str:
        """How the study ran, one sentence; `where`: with its hosts and devices (the report's; the
        paper names them in the sentence before)."""
        hosts = ", ".join(self.hosts) or "an unrecorded host"
        if self.executor == UNKNOWN:
            return "No run recorded which executor ran it."
        if self.executor == LOCAL:
            machine = f"one machine ({hosts})" if len(self.hosts) <= 1 else hosts
            place = f" on {machine}, {self.ranks()}" if where else ""
            return (
                f"Snakemake's local executor ran every job of this study{place};"
                " no batch system was involved (no run recorded a batch job)."
            )
        place = f" on {hosts}, {self.ranks()}" if where else ""
        detail = self.slurm_detail()
        jobs = _count(len(self.slurm_jobs), "Slurm job")
        if self.executor == ALLOCATION:
            return (
                f"Every training run was a step of one Slurm allocation (job {self.slurm_jobs[0]}"
                + (f", {detail}" if detail else "")
                + f"), run by Snakemake's local executor inside it{place}."
            )
        slurm = f"Slurm ({detail})" if detail else "Slurm"
        if self.executor == SLURM:
            return (
                f"{slurm} ran the {_count(self.runs, 'training run')} as {jobs}, submitted by"
                f" Snakemake's Slurm executor plugin{place.replace(' on', ', on', 1)}."
            )
        return (
            f"{slurm} ran {self.slurm_runs} of the {_count(self.runs, 'training run')} (as {jobs}){place};"
            " Snakemake's local executor ran the others."
        )


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" + ("" if number == 1 else "s")


def _distinct(frame: pd.DataFrame | None, column: str) -> tuple[str, ...]:
    if frame is None or column not in frame:
        return ()
    values = frame[column].dropna().astype(str).str.strip()
    return tuple(sorted({value for value in values if value.lower() not in NONE}))


def job_ids(runs: pd.DataFrame) -> pd.Series:
    """Each run's Slurm job id (without a step suffix), empty text where it had none."""
    found = pd.Series("", index=runs.index, dtype=object)
    for column in JOB_COLUMNS:
        if column in runs:
            text = runs[column].astype(object).where(runs[column].notna(), "").astype(str)
            text = text.str.split(".").str[0].str.strip()
            found = found.where(found != "", text.where(~text.str.lower().isin(NONE), ""))
    return found


def describe(runs: pd.DataFrame, system: pd.DataFrame | None = None) -> Execution:
    """The Execution of a run catalog (runs.csv) and, where Slurm ran, system.csv's Slurm version."""
    ids = job_ids(runs)
    under_slurm = ids != ""
    jobs = tuple(sorted(set(ids[under_slurm])))
    if runs.empty:
        executor = UNKNOWN
    elif not under_slurm.any():
        executor = LOCAL
    elif not under_slurm.all():
        executor = MIXED
    else:
        executor = ALLOCATION if len(jobs) == 1 and len(runs) > 1 else SLURM
    hosts = {host for cell in _distinct(runs, "hosts") for host in cell.split(",") if host}
    slurm = bool(under_slurm.any())
    return Execution(
        executor=executor,
        runs=len(runs),
        slurm_runs=int(under_slurm.sum()),
        slurm_jobs=jobs,
        slurm_versions=_slurm_versions(system) if slurm else (),
        clusters=_distinct(runs, "provenance.slurm.cluster_name") if slurm else (),
        hosts=tuple(sorted(hosts)),
        devices=_distinct(runs, "device_name"),
        on_gpu=any(device.startswith("cuda") for device in _distinct(runs, "device")),
    )


def _slurm_versions(system: pd.DataFrame | None) -> tuple[str, ...]:
    """system.csv's slurm column, `sinfo --version`'s ('slurm 23.11.4' -> '23.11.4')."""
    return tuple(sorted({value.split()[-1] for value in _distinct(system, "slurm")}))


def report_words(execution: Execution) -> dict[str, str]:
    """The report's words (reStructuredText) for what differs between a study Slurm ran and one it
    did not: report/*.rst use them as |name| substitutions."""
    if not execution.slurm:
        return {
            "executed": execution.sentence(),
            "job-provenance": "the batch job, none here as the local executor ran every job",
            "accounting": "``sacct.elapsed_s``, ``sacct.state`` and ``sacct.max_rss_mb``, empty here"
            " (no batch system accounted the jobs; ``sacct.note`` says so)",
            "accounted-energy": "no batch system's energy accounting (``sacct.energy_consumed_j`` is"
            " empty: the local executor ran the jobs)",
            "scheduler-version": "the batch system's version (none: the local executor ran the jobs)",
            "elapsed": "each run's own wall time: no batch system accounted the jobs",
        }
    return {
        "executed": execution.sentence(),
        "job-provenance": "the Slurm job id and node list",
        "accounting": "where Slurm accounting answered, ``sacct.elapsed_s``, ``sacct.state`` and"
        " ``sacct.max_rss_mb`` (otherwise empty, with ``sacct.note`` saying why)",
        "accounted-energy": "Slurm's own ``ConsumedEnergy`` (``sacct.energy_consumed_j``) where the"
        " site accounts energy (``sacct.energy_note`` where it does not)",
        "scheduler-version": "the Slurm version",
        "elapsed": "Slurm's elapsed time where its accounting answered",
    }


def substitutions(words: dict[str, str]) -> str:
    """The words as reStructuredText substitution definitions, one a line."""
    header = ".. Written by scalestudy.analysis.execution from runs.csv: how the study ran.\n\n"
    lines = [f".. |{name}| replace:: {' '.join(text.split())}\n" for name, text in words.items()]
    return header + "".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = cli.parser(__doc__.splitlines()[0], with_settings=False)
    parser.add_argument("--runs", required=True, help="The run catalog (runs.csv).")
    parser.add_argument("--system", help="The system table (system.csv): the Slurm version.")
    parser.add_argument("--out", required=True, help=f"The substitutions file to write ({REPORT_TEXT}).")
    args = parser.parse_args(argv)
    cli.start(args)
    try:
        runs = read_csv(args.runs)
        system = read_csv(args.system) if args.system else None
    except cli.BAD_INPUT as error:
        return cli.refuse(error)
    execution = describe(runs, system)
    atomic.write_text(args.out, substitutions(report_words(execution)))
    cli.log.info("%s -> %s", execution.sentence(), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
