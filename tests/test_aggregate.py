"""The run catalog: summaries -> runs.csv, Slurm accounting where it answers."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from scalestudy import contract
from scalestudy.analysis import accounting, aggregate, energy
from scalestudy.analysis import constructed_study as synthetic
from scalestudy.plan import studyconfig

SACCT_OUTPUT = """\
1001|COMPLETED|00:10:05|
1001.batch|COMPLETED|00:10:05|2048K
1001.0|COMPLETED|00:10:00|1.5G
1002|FAILED|1-02:03:04|
"""


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """A constructed demo-sized study: every grid point's run folder."""
    root = tmp_path_factory.mktemp("study")
    config = studyconfig.load(Path(__file__).resolve().parents[1] / "config/demo.yaml")
    folders = synthetic.make_study(root, config, synthetic.Truth(gpu=False))
    return root, folders


def summaries(folders):
    return [folder / "summary.json" for folder in folders]


def fake_sacct(stdout: str, returncode: int = 0, stderr: str = ""):
    calls = []

    def runner(argv):
        calls.append(argv)
        return subprocess.CompletedProcess(argv, returncode, stdout, stderr)

    runner.calls = calls
    return runner


def test_parse_sacct_takes_state_from_job_and_rss_from_steps():
    jobs = accounting.parse_sacct(SACCT_OUTPUT)
    assert jobs["1001"] == {
        "state": "COMPLETED",
        "elapsed_s": 605.0,
        "max_rss_mb": pytest.approx(1536.0),
        "consumed_energy_j": None,  # four fields: a query without ConsumedEnergyRaw
    }
    assert jobs["1002"]["elapsed_s"] == 86400 + 2 * 3600 + 3 * 60 + 4
    assert jobs["1002"]["max_rss_mb"] is None


def test_parse_sacct_takes_the_jobs_consumed_energy_where_the_site_accounts_it():
    jobs = accounting.parse_sacct(
        "2001|COMPLETED|00:10:00||5400000\n"  # the allocation's: the job's total
        "2001.batch|COMPLETED|00:10:00|2048K|5400000\n"
        "2001.0|COMPLETED|00:09:58|1.5G|5390000\n"
        "2002|COMPLETED|00:10:00||0\n"  # no energy plugin: 0
        "2002.0|COMPLETED|00:10:00|1G|0\n"
        "2003|COMPLETED|00:10:00||\n"  # the allocation line without a figure: the largest step's
        "2003.batch|COMPLETED|00:10:00|1G|1200\n"
        "2003.0|COMPLETED|00:10:00|1G|3400\n"
        f"2004|COMPLETED|00:10:00||{2**64 - 2}\n"  # NO_VAL64: unknown
    )
    assert jobs["2001"]["consumed_energy_j"] == 5_400_000.0
    assert jobs["2002"]["consumed_energy_j"] is None and jobs["2004"]["consumed_energy_j"] is None
    assert jobs["2003"]["consumed_energy_j"] == 3400.0
    assert accounting.SACCT_FIELDS.endswith(",ConsumedEnergyRaw")


@pytest.mark.parametrize(("text", "seconds"), [("00:01:02", 62), ("05:30.5", 330.5), ("2-00:00:00", 172800)])
def test_parse_elapsed(text, seconds):
    assert accounting.parse_elapsed(text) == seconds


def test_catalog_has_one_row_per_run_with_provenance(study):
    _, folders = study
    catalog = aggregate.build_catalog(summaries(folders))
    assert len(catalog) == len(folders) == 15
    assert list(catalog["stage"].unique()) == ["baseline", "scaling", "sensitivity", "profile"]
    for column in ("point", "images_per_s", "config.precision", "provenance.slurm.job_id", "hosts", "job_id"):
        assert catalog[column].notna().all(), column
    assert set(aggregate.SACCT_COLUMNS) <= set(catalog.columns)
    assert (catalog["sacct.note"] == "accounting not queried").all()


def test_catalog_with_sacct_answers(study):
    _, folders = study
    paths = summaries(folders)[:2]
    ids = accounting.job_ids(paths)
    first_id = accounting.job_id(json.loads(paths[0].read_text()))
    output = f"{first_id}|COMPLETED|00:02:00||0\n{first_id}.0|COMPLETED|00:01:59|100M|0\n"
    runner = fake_sacct(output)
    record = accounting.query_sacct(ids, runner)
    assert runner.calls[0][:2] == ["sacct", "--parsable2"] and runner.calls[0][-1] == ",".join(ids)
    assert accounting.SACCT_FIELDS in runner.calls[0]
    catalog = aggregate.build_catalog(paths, json.loads(json.dumps(record)))  # as it travels: via JSON
    first, second = catalog.iloc[0], catalog.iloc[1]
    assert (first["sacct.elapsed_s"], first["sacct.state"], first["sacct.max_rss_mb"]) == (
        120.0,
        "COMPLETED",
        100.0,
    )
    assert (
        pd.isna(first["sacct.energy_consumed_j"]) and first["sacct.energy_note"] == aggregate.NO_SITE_ENERGY
    )
    assert pd.isna(second["sacct.elapsed_s"]) and second["sacct.note"] == "no sacct record"


def test_the_sites_energy_sits_beside_nvmls(tmp_path):
    """A GPU study's run with NVML's energy and the job's ConsumedEnergy from sacct, in one row."""
    config = studyconfig.load(Path(__file__).resolve().parents[1] / "config/demo.yaml")
    (folder, *_) = synthetic.make_study(tmp_path, config, synthetic.Truth(gpu=True))
    job = accounting.job_id(json.loads((folder / "summary.json").read_text()))
    record = {"note": None, "jobs": {job: {"state": "COMPLETED", "consumed_energy_j": 9.5e5}}}
    row = aggregate.build_catalog([folder / "summary.json"], record).iloc[0]
    assert row["sacct.energy_consumed_j"] == 9.5e5 and pd.isna(row["sacct.energy_note"])
    assert row["energy_source"] == "counter" and row["energy_j"] > 0


def test_sacct_failure_leaves_columns_empty_with_a_note(study):
    _, folders = study
    record = accounting.query_sacct(["1", "2"], fake_sacct("", 1, "accounting disabled"))
    catalog = aggregate.build_catalog(summaries(folders)[:3], record)
    assert catalog["sacct.elapsed_s"].isna().all()
    assert catalog["sacct.note"].str.contains("sacct failed (1): accounting disabled", regex=False).all()


def test_no_job_ids_means_no_query():
    runner = fake_sacct(SACCT_OUTPUT)
    record = accounting.query_sacct([], runner)
    assert record["jobs"] == {} and "no Slurm job id" in record["note"] and runner.calls == []


def test_accounting_cli_without_sacct_still_writes(study, tmp_path, monkeypatch):
    _, folders = study
    monkeypatch.setenv("PATH", str(tmp_path))  # no sacct here
    out = tmp_path / "sacct.json"
    assert accounting.main(["--summaries", *map(str, summaries(folders)), "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record == {"jobs": {}, "note": "sacct not found on this host"}


def test_hosts_are_every_rank_host(tmp_path):
    record = {
        "run": {"stage": "scaling", "point": "strong/w2_r0"},
        "results": dict.fromkeys(aggregate.REQUIRED_RESULTS, 1),
        "provenance": {"hosts": ["n1", "n2"], "host": "n1", "slurm": {"job_id": "7"}},
    }
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(record))
    row = aggregate.summary_row(path)
    assert row["hosts"] == "n1,n2" and row["provenance.slurm.job_id"] == "7"


def test_missing_key_names_the_file(tmp_path):
    path = tmp_path / "summary.json"
    path.write_text(
        json.dumps({"run": {"stage": "baseline", "point": "default"}, "results": {"world_size": 1}})
    )
    with pytest.raises(KeyError, match=rf"{path}: missing key 'results.global_batch'"):
        aggregate.summary_row(path)


def test_invalid_json_names_the_file(tmp_path):
    path = tmp_path / "summary.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match=rf"{path}: not valid JSON"):
        aggregate.summary_row(path)


def test_cli_writes_catalog(study, tmp_path):
    _, folders = study
    out, record = tmp_path / "runs.csv", tmp_path / "sacct.json"
    record.write_text(json.dumps({"note": "sacct not found on this host", "jobs": {}}))
    aggregate.main(
        ["--summaries", *map(str, summaries(folders)), "--accounting", str(record), "--out", str(out)]
    )
    catalog = pd.read_csv(out)
    assert len(catalog) == 15 and "sacct.max_rss_mb" in catalog.columns
    assert (catalog["sacct.note"] == "sacct not found on this host").all()
    # a CPU study: every energy figure empty, energy_source saying why, never a zero
    assert catalog["energy_source"].str.startswith("not measured: no NVIDIA GPU (device cpu)").all()
    assert catalog["energy_source"].str.contains("RAPL").all()
    for column in ("energy_j", "energy_window_j", "joules_per_sample", "energy_to_target_j"):
        assert catalog[column].isna().all(), column
    assert (catalog["gpu_hours"] > 0).all()


def test_a_summary_from_before_energy_is_measured_from_its_run_folder(tmp_path):
    """aggregate measures an older summary (no energy keys) from the monitor files beside it."""
    config = studyconfig.load(Path(__file__).resolve().parents[1] / "config/demo.yaml")
    (folder, *_) = synthetic.make_study(tmp_path, config, synthetic.Truth(gpu=True))
    written = json.loads((folder / "summary.json").read_text())
    older = {
        **written,
        "results": {k: v for k, v in written["results"].items() if k not in energy.ENERGY_KEYS},
    }
    (folder / "summary.json").write_text(json.dumps(older))
    row = aggregate.build_catalog([folder / "summary.json"]).iloc[0]
    assert row["energy_source"] == "counter"
    assert row["energy_j"] == pytest.approx(written["results"]["energy_j"])
    (folder / "gpu_monitor.csv").unlink()
    row = aggregate.build_catalog([folder / "summary.json"]).iloc[0]
    assert row["energy_source"] == f"not measured: no gpu_monitor.csv in {folder}" and pd.isna(
        row["energy_j"]
    )


def test_the_window_columns_reach_the_catalog(tmp_path, capsys):
    window = {"window_filled": False, "measured_steps": 3, "measure_start_s": 1.5, "measure_end_s": None}
    ddp = {"ddp_options": {"static_graph": True, "forward_sync_buffers": False}}
    record = {
        "run": {"stage": "scaling", "point": "weak/w2_r0"},
        "results": {**dict.fromkeys(aggregate.REQUIRED_RESULTS, 1), "images_per_s": None, **window, **ddp},
        "provenance": {},
    }
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(record))
    out = tmp_path / "runs.csv"
    aggregate.main(["--summaries", str(path), "--out", str(out)])
    row = pd.read_csv(out).iloc[0]
    assert not row["window_filled"] and row["measured_steps"] == 3 and row["measure_start_s"] == 1.5
    assert pd.isna(row["images_per_s"]) and pd.isna(row["measure_end_s"])
    assert row["ddp_options.static_graph"] and not row["ddp_options.forward_sync_buffers"]
    assert "scaling/weak/w2_r0: measurement window not filled" in capsys.readouterr().err


def test_a_missing_accounting_file_is_one_line_naming_it(study, tmp_path, capsys):
    """`--accounting` naming no file: exit 2 and one line saying which, no traceback, no catalog."""
    _, folders = study
    missing, out = tmp_path / "sacct.json", tmp_path / "runs.csv"
    argv = ["--summaries", *map(str, summaries(folders)), "--accounting", str(missing), "--out", str(out)]
    assert aggregate.main(argv) == contract.EXIT_BAD_CONFIG
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1 and said[0].endswith(f"{missing}: no such file"), said
    assert not out.exists()
