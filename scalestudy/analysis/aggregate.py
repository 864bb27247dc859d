"""The run catalog: every run's summary.json -> one row of results/tables/runs.csv.

A row holds the grid point (stage, point), the run's results (unprefixed: images_per_s, ...; the
steady-state window's window_filled, measured_steps, measured_s, images_per_s_min/max/cv,
measure_start_s/end_s, and the whole_run_* rates; nested ones dotted: ddp_options.static_graph),
its run config (`config.<key>`), its provenance flattened (`provenance.<key>`, Slurm job id and
hosts included) and, where Slurm accounting answers, `sacct.elapsed_s`, `sacct.state`,
`sacct.max_rss_mb` and `sacct.energy_consumed_j` (the site's energy plugin's joules for the job;
empty, with `sacct.energy_note` saying so, where the site accounts none). Where it does not (no
sacct, no job id, no record), those columns are present and empty and `sacct.note` says why. The
accounting itself is queried by scalestudy.analysis.accounting (on the submit host, outside the
container) and passed in as JSON.

Every row names its workload, sample_unit (what the throughput columns count: images, tokens, ...)
and parallelism (ddp, fsdp), with the peak memory and model-state bytes per rank, the final test
loss and (the LM) perplexity: a summary written before these existed reads as the
ResNet-18/CIFAR-10 DDP study (WORKLOAD_DEFAULTS) with the others empty. A run that did not fill its
window keeps its row (images_per_s empty) and is named in the log; scalestudy.analysis.metrics
marks it. So does a contended run (a foreign process on its GPUs while it measured: `contended`,
`contention`, `contention_checked`, `monitor_window_samples`, `host_load_warning`, from its summary,
or judged from its run folder's GPU monitor files where the summary predates them:
scalestudy.analysis.contention). Its energy (`energy_source`, `energy_j`, `energy_window_j`,
`joules_per_sample`, `energy_to_target_j`, `gpu_hours`, ...: scalestudy.analysis.energy) comes
the same way: from its summary, else from its run folder; "not measured: <why>" in `energy_source`
with the numbers empty where nothing measured it.

    python -m scalestudy.analysis.aggregate --summaries results/runs/*/.../summary.json \
        [--accounting results/tables/sacct.json] --out results/tables/runs.csv
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from scalestudy import atomic, provenance
from scalestudy.analysis import accounting, cli, contention, energy
from scalestudy.analysis.tableio import dig, read_json
from scalestudy.plan import runconfig, workloads

log = logging.getLogger("scalestudy.analysis.aggregate")

# Results every analysis step relies on; a summary without them is rejected, naming the file.
REQUIRED_RESULTS = (
    "world_size",
    "global_batch",
    "per_gpu_batch",
    "images_per_s",
    "images_per_s_per_gpu",
    "epoch_time_s",
    "total_time_s",
)
# Results every row carries; None (an empty cell) where an older summary lacks them.
MEMORY_AND_QUALITY = (
    "peak_memory_bytes",
    "model_state_bytes_per_rank",
    "final_test_loss",
    "final_test_perplexity",
)
WORKLOAD_DEFAULTS = {key: runconfig.DEFAULTS[key] for key in ("workload", "parallelism")}
SACCT_COLUMNS = (
    "sacct.elapsed_s",
    "sacct.state",
    "sacct.max_rss_mb",
    "sacct.energy_consumed_j",
    "sacct.energy_note",
    "sacct.note",
)
NO_SITE_ENERGY = "the site does not account energy (sacct ConsumedEnergyRaw empty or 0)"


def summary_row(path: str | Path) -> dict[str, Any]:
    """One catalog row from one summary.json."""
    summary = read_json(path)
    run = dig(summary, "run", path)
    results = dig(summary, "results", path)
    for key in ("stage", "point"):
        dig(summary, f"run.{key}", path)
    for key in REQUIRED_RESULTS:
        dig(summary, f"results.{key}", path)
    prov = provenance.flatten(summary.get("provenance") or {}, "provenance.")
    if "contended" not in results:  # a summary written before the trainer judged contention
        results = {**results, **contention.of_folder(Path(path).parent, results)}
    if "energy_source" not in results:  # a summary written before the trainer measured energy
        results = {**results, **energy.of_folder(Path(path).parent, results)}
    resumed = results.get("resumed_from_step")
    row = {
        "stage": run["stage"],
        "point": run["point"],
        "run_dir": str(Path(path).parent),
        "status": "completed" if resumed is None else "completed (resumed)",
        # The Snakemake attempt that made it; every attempt's log is kept (scalestudy.launch.attempt_logs).
        "attempts": (summary.get("provenance") or {}).get("attempt"),
        "hosts": _hosts(summary.get("provenance") or {}),
        "job_id": accounting.job_id(summary),
    }
    row.update(provenance.flatten(results))
    row.update(workload_columns(results, run))
    row.update(provenance.flatten(run, "config."))
    row.update(prov)
    return row


def workload_columns(results: dict, run: dict) -> dict[str, Any]:
    """workload, sample_unit, parallelism (the results', else the run config's, else the ResNet DDP
    defaults) and the memory and quality results (None where the summary has none)."""
    columns = {key: results.get(key) or run.get(key) or default for key, default in WORKLOAD_DEFAULTS.items()}
    unit = results.get("sample_unit") or (run.get("command") or {}).get("sample_unit")
    if not unit:
        try:
            unit = workloads.get(columns["workload"]).sample_unit
        except ValueError:
            unit = "samples"
    columns["sample_unit"] = unit
    columns.update({key: results.get(key) for key in MEMORY_AND_QUALITY})
    return columns


def _hosts(prov: dict) -> str | None:
    """Every rank's host (the trainer records them), else the Slurm node list, else rank 0's host."""
    hosts = prov.get("hosts")
    if isinstance(hosts, list) and hosts:
        return ",".join(map(str, hosts))
    return prov.get("slurm_nodelist") or (prov.get("slurm") or {}).get("job_nodelist") or prov.get("host")


def add_accounting(catalog: pd.DataFrame, accounting: dict | None) -> pd.DataFrame:
    """Fill the sacct.* columns (always present) from analysis.accounting's record; sacct.note says
    why a row has none."""
    catalog = catalog.copy()
    for column in SACCT_COLUMNS:
        catalog[column] = pd.Series([None] * len(catalog), dtype=object)
    if accounting is None:
        catalog["sacct.note"] = "accounting not queried"
        return catalog
    jobs, note = accounting.get("jobs") or {}, accounting.get("note")
    for index, job in catalog["job_id"].items():
        record = jobs.get(job) if job else None
        if record is None:
            catalog.at[index, "sacct.note"] = note or ("no Slurm job id" if not job else "no sacct record")
            continue
        catalog.at[index, "sacct.elapsed_s"] = record.get("elapsed_s")
        catalog.at[index, "sacct.state"] = record.get("state")
        catalog.at[index, "sacct.max_rss_mb"] = record.get("max_rss_mb")
        consumed = record.get("consumed_energy_j")
        catalog.at[index, "sacct.energy_consumed_j"] = consumed
        catalog.at[index, "sacct.energy_note"] = None if consumed is not None else NO_SITE_ENERGY
    return catalog


STAGE_ORDER = {"baseline": 0, "scaling": 1, "sensitivity": 2, "profile": 3}


def build_catalog(summary_paths: Sequence[str | Path], accounting: dict | None = None) -> pd.DataFrame:
    rows = [summary_row(path) for path in summary_paths]
    if not rows:
        raise ValueError("no summary.json given: the run catalog would be empty")
    catalog = pd.DataFrame(rows)
    catalog = catalog.sort_values(["stage", "point"], key=_stage_sort_key, kind="stable").reset_index(
        drop=True
    )
    return add_accounting(catalog, accounting)


def _stage_sort_key(column: pd.Series) -> pd.Series:
    return column.map(STAGE_ORDER).fillna(99) if column.name == "stage" else column


def main(argv: Sequence[str] | None = None) -> int:
    parser = cli.parser(__doc__.splitlines()[0], with_settings=False)
    parser.add_argument("--summaries", nargs="+", required=True, help="summary.json of every run.")
    parser.add_argument(
        "--accounting", help="Slurm accounting JSON (analysis.accounting); absent: not queried."
    )
    parser.add_argument("--out", required=True, help="The run catalog CSV to write.")
    args = parser.parse_args(argv)
    cli.start(args)
    try:
        accounting = read_json(args.accounting) if args.accounting else None
        catalog = build_catalog(args.summaries, accounting)
    except cli.BAD_INPUT as error:  # a missing or unreadable file: one line naming it
        return cli.refuse(error)
    atomic.write_csv(args.out, catalog)
    if "window_filled" in catalog:
        for _, row in catalog[catalog["window_filled"].eq(False)].iterrows():
            log.warning("%s/%s: measurement window not filled (whole-run rates)", row["stage"], row["point"])
    for _, row in catalog[contention.contended(catalog)].iterrows():
        log.warning("%s/%s: contended: %s", row["stage"], row["point"], row["contention"])
    log.info("run catalog: %d runs, %d columns -> %s", len(catalog), len(catalog.columns), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
