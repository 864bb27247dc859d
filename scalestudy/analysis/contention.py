"""Contention: whether a run shared its GPUs with a process that is not its own while it measured,
with the evidence; how many GPU monitor samples its window held; and the command that re-measures
every contended point.

From a run's gpu_monitor.csv and gpu_monitor.json (scalestudy.train.gpu_monitor, whose processes
scalestudy.train.gpu_processes tells apart) and its measurement window (monitor_window.window_of_results:
the window's unpaused stretches; the whole run where the window was not filled; nothing where the
run reports an earlier attempt's window), the trainer adds to summary.json's results, and
scalestudy.analysis.aggregate to runs.csv (for a summary written before these keys existed):

- `contended`: a foreign process was on one of the job's GPUs in a sample inside the window;
- `contention`: the evidence per GPU, e.g. "GPU-0a1b... on gpu01: 2 foreign processes (pids 123,
  456; 3100 MB) in 14 of 40 window samples"; empty when not contended;
- `contention_checked`: NVML listed processes on the GPU (at least the job's own) in a window
  sample (false: the NVML has no process query, lists none while the job runs, as it may inside a
  container that hides other PID namespaces, no GPU was sampled, or no sample is in the window);
- `monitor_window_samples`: the GPU monitor's samples inside the window, per GPU, the minimum (empty
  without GPU samples); the analysis compares it with analysis.monitor.min_window_samples
  (`monitor_window_short`, scalestudy.analysis.metrics);
- `host_load_warning`: the host's 1-minute load, averaged over the window, above the job's CPUs (its
  ranks' affinity; the host's CPUs where unknown): evidence of CPU contention, not a verdict (the
  load counts every process of the host, on every core).

A contended run keeps its row and its numbers, marked: the tables count such repeats, the figures
draw them apart, the acceptance table gives no verdict from them, the paper's threats to validity
name them. Re-measuring them is one command (`targets` prints their summary.json, the output of
their training rule, which Snakemake's --forcerun runs again, and everything after it):

    snakemake --profile profiles/local --forcerun $(python -m scalestudy.analysis.contention targets)
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from scalestudy.analysis import cli, monitor_window
from scalestudy.analysis.tableio import read_csv, read_json
from scalestudy.plan import paths, runfiles

log = logging.getLogger("scalestudy.analysis.contention")

RUN_KEYS = ("contended", "contention", "contention_checked", "monitor_window_samples", "host_load_warning")
RUNS_CSV = f"{paths.TABLES_DIR}/runs.csv"


def not_judged() -> dict[str, Any]:
    """The keys of a run without GPU samples: nothing seen, nothing claimed."""
    return dict(zip(RUN_KEYS, (False, "", False, None, ""), strict=True))


def of_folder(run_dir: str | Path, results: dict) -> dict[str, Any]:
    """The contention keys of the run folder's monitor files within the window of `results`."""
    run_dir = Path(run_dir)
    csv_path = run_dir / runfiles.GPU_MONITOR
    if not csv_path.is_file():
        return not_judged()
    samples = read_csv(csv_path, monitor_window.REQUIRED)
    info_path = run_dir / runfiles.GPU_MONITOR_INFO
    info = read_json(info_path) if info_path.is_file() else {}
    return judge(samples, info, monitor_window.window_of_results(results))


def judge(samples: pd.DataFrame, info: dict, window: list[tuple[float, float]] | None) -> dict[str, Any]:
    """The contention keys of one run's samples (gpu_monitor.csv), its monitor summary
    (gpu_monitor.json: the foreign PIDs' sightings, the job's CPUs) and window (None: the whole run)."""
    verdict = not_judged()
    if samples.empty:
        return verdict
    inside = samples[monitor_window.inside(samples["time_s"], window)] if window is not None else samples
    gpus = samples.groupby(["host", "gpu_uuid"]).size().index
    counts = inside.groupby(["host", "gpu_uuid"]).size().reindex(gpus, fill_value=0)
    verdict["monitor_window_samples"] = int(counts.min())
    if "processes" in inside:
        listed = pd.to_numeric(inside["processes"], errors="coerce")
        verdict["contention_checked"] = bool((listed > 0).any())  # an empty list while training is blind
    evidence = [
        _gpu_evidence(host, uuid, rows, _gpu_report(info, host, uuid), window)
        for (host, uuid), rows in inside.groupby(["host", "gpu_uuid"], sort=True)
        if "foreign_processes" in rows
        and (pd.to_numeric(rows["foreign_processes"], errors="coerce") > 0).any()
    ]
    verdict["contended"] = bool(evidence)
    verdict["contention"] = "; ".join(evidence)
    verdict["host_load_warning"] = host_load_warning(inside, info)
    return verdict


def _gpu_report(info: dict, host: str, uuid: str) -> dict:
    for node in info.get("nodes") or []:
        for gpu in node.get("gpus") or []:
            if gpu.get("uuid") == uuid and node.get("host") == host:
                return gpu.get("processes") or {}
    return {}


def _gpu_evidence(host: str, uuid: str, rows: pd.DataFrame, report: dict, window) -> str:
    foreign = pd.to_numeric(rows["foreign_processes"], errors="coerce")
    hit = rows[foreign > 0]
    most = int(foreign.max())
    where = f"{uuid} on {host}: "
    seen = f" in {len(hit)} of {len(rows)} window samples"
    spans = [span for span in report.get("foreign") or [] if _meets(span, window)]
    identified = sorted({int(span["pid"]) for span in spans if span.get("identified", True)})
    unidentified = sorted({int(span["pid"]) for span in spans if not span.get("identified", True)})
    if unidentified and not identified:
        expected = report.get("expected_own", 1)
        return (
            f"{where}{_count(most, 'process')} beyond the job's {expected} (PIDs not comparable, a PID "
            f"namespace: NVML listed pids {_join(unidentified)}){seen}"
        )
    memory = (
        pd.to_numeric(hit.get("foreign_mem_mb"), errors="coerce").max()
        if "foreign_mem_mb" in hit
        else math.nan
    )
    details = [f"pids {_join(identified)}"] if identified else []
    details.append(f"{memory:.0f} MB" if pd.notna(memory) else "GPU memory not reported")
    return f"{where}{_count(most, 'foreign process')} ({'; '.join(details)}){seen}"


def _meets(span: dict, window) -> bool:
    """Whether a process's sighting [first_s, last_s] meets the window (None: the whole run)."""
    if window is None:
        return True
    return any(span["first_s"] <= end and span["last_s"] >= start for start, end in window)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'es' if noun.endswith('s') and n != 1 else ''}"


def _join(pids: Sequence[int]) -> str:
    return ", ".join(map(str, pids))


def host_load_warning(inside: pd.DataFrame, info: dict) -> str:
    """Hosts whose mean 1-minute load in the window exceeds the job's CPUs there (else the host's)."""
    if "host_load_1m" not in inside:
        return ""
    job_cpus = {node.get("host"): len(node.get("cpus") or ()) for node in info.get("nodes") or []}
    warnings = []
    for host, rows in inside.groupby("host", sort=True):
        load = pd.to_numeric(rows["host_load_1m"], errors="coerce").mean()
        host_cpus = pd.to_numeric(rows["host_cpus"], errors="coerce").max()
        cpus = job_cpus.get(host) or host_cpus
        if pd.isna(load) or pd.isna(cpus) or load <= cpus:
            continue
        whose = (
            f"the job's {int(cpus)} CPUs (the host has {host_cpus:.0f})"
            if job_cpus.get(host)
            else (f"the host's {int(cpus)} CPUs")
        )
        warnings.append(f"{host}: 1-minute load {load:.1f} (mean in the window) above {whose}")
    return "; ".join(warnings)


# --- the run catalog's columns ----------------------------------------------------------------------


def flags(runs: pd.DataFrame, column: str) -> pd.Series:
    """A boolean column of runs.csv read back (True/False, "True"/"False"); absent or empty: False."""
    if column not in runs:
        return pd.Series(False, index=runs.index)
    text = runs[column].map(lambda value: str(value).strip().lower())
    return text.eq("true")


def contended(runs: pd.DataFrame) -> pd.Series:
    return flags(runs, "contended")


def window_short(runs: pd.DataFrame, min_samples: int) -> pd.Series:
    """Runs whose window held fewer GPU monitor samples than `min_samples` (no GPU samples: False)."""
    if "monitor_window_samples" not in runs:
        return pd.Series(False, index=runs.index)
    samples = pd.to_numeric(runs["monitor_window_samples"], errors="coerce")
    return samples.notna() & (samples < min_samples)


def targets(runs: pd.DataFrame, where: str = "runs") -> list[str]:
    """The summary.json of every contended run: the files `snakemake --forcerun` measures anew."""
    if "run_dir" not in runs:
        raise ValueError(f"{where}: missing column run_dir (runs.csv of scalestudy.analysis.aggregate)")
    chosen = runs.loc[contended(runs), "run_dir"]
    return sorted({f"{Path(str(run_dir)).as_posix()}/{runfiles.SUMMARY}" for run_dir in chosen})


def main(argv: Sequence[str] | None = None) -> int:
    parser = cli.parser(__doc__.splitlines()[0], with_settings=False)
    commands = parser.add_subparsers(dest="command", required=True)
    command = commands.add_parser("targets", help="Print the summary.json of every contended run.")
    command.add_argument("--runs", default=RUNS_CSV, help=f"The run catalog (default {RUNS_CSV}).")
    args = parser.parse_args(argv)
    cli.start(args)
    try:
        runs = read_csv(args.runs, ["run_dir"])
    except FileNotFoundError as missing:
        raise SystemExit(f"contention: {missing} (the study's run catalog: run the study first)") from None
    found = targets(runs, args.runs)
    log.info("%d contended run(s) in %s", len(found), args.runs)
    for target in found:
        print(target)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
