"""Provenance: every result can be traced to its commit, config, software, host and Slurm job."""

from scalestudy import progress, provenance


def test_config_hash_ignores_key_order_but_not_values():
    assert provenance.config_hash({"a": 1, "b": 2}) == provenance.config_hash({"b": 2, "a": 1})
    assert provenance.config_hash({"a": 1}) != provenance.config_hash({"a": 2})


def test_collect_records_slurm_job_and_commit_from_the_environment(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "gpu[01-02]")
    monkeypatch.setenv(provenance.GIT_COMMIT_ENV, "abc123")
    monkeypatch.setenv(provenance.GIT_DIRTY_ENV, "0")
    record = provenance.collect(config={"x": 1}, seed=7)
    assert record["slurm"]["job_id"] == "4242"
    assert record["slurm"]["job_nodelist"] == "gpu[01-02]"
    assert (record["git_commit"], record["git_dirty"], record["seed"]) == ("abc123", False, 7)
    assert record["versions"]["python"] and record["host"]


def test_flatten_gives_dotted_columns():
    assert provenance.flatten({"a": {"b": 1, "c": [1, 2]}, "d": None}) == {
        "a.b": 1,
        "a.c": "[1, 2]",
        "d": None,
    }


def test_progress_line_has_rate_and_eta():
    bar = progress.Progress("download", total=1000, unit="B")
    bar.done = 500
    line = bar.line(now=bar._t0 + 5)
    assert "500.0 B/1000.0 B (50%)" in line and "ETA 0:05" in line and "100.0 B/s" in line
