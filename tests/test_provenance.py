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


def _git(cwd, *args):
    import subprocess

    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    return subprocess.run(
        ["git", "-C", str(cwd), *args],
        check=True,
        capture_output=True,
        text=True,
        env={**__import__("os").environ, **env},
    ).stdout.strip()


def _export_project(folder):
    """The workflow's own files, as an exported copy (no .git of its own) holds them."""
    (folder / "scalestudy").mkdir(parents=True)
    (folder / "Snakefile").write_text("# the workflow\n")
    (folder / "scalestudy" / "provenance.py").write_text("# provenance\n")
    return folder


def test_an_exported_copy_inside_an_unrelated_repository_records_no_commit(tmp_path, monkeypatch):
    """Run from a copy of the project inside another repository that ignores it, the study used to record
    that repository's commit as its own (dirty): it records none."""
    monkeypatch.delenv(provenance.GIT_COMMIT_ENV, raising=False)
    monkeypatch.delenv(provenance.GIT_DIRTY_ENV, raising=False)
    outer = tmp_path / "other-project"
    outer.mkdir()
    _git(outer, "init", "-q")
    (outer / ".gitignore").write_text("scalestudy-export/\n")
    (outer / "notes.txt").write_text("another project\n")
    _git(outer, "add", ".")
    _git(outer, "commit", "-q", "-m", "other")
    (outer / "notes.txt").write_text("changed\n")  # the other project is dirty too
    other_commit = _git(outer, "rev-parse", "HEAD")
    export = _export_project(outer / "scalestudy-export")

    state = provenance.git_state(export)
    assert state == {"git_commit": "unknown", "git_dirty": None}
    assert other_commit not in str(state)
    provenance.export_git_state(export)
    assert provenance.git_state()["git_commit"] == "unknown"


def test_a_repository_that_tracks_the_workflow_names_its_commit_and_dirty_state(tmp_path, monkeypatch):
    monkeypatch.delenv(provenance.GIT_COMMIT_ENV, raising=False)
    project = _export_project(tmp_path / "project")
    _git(project, "init", "-q")
    _git(project, "add", ".")
    _git(project, "commit", "-q", "-m", "workflow")
    commit = _git(project, "rev-parse", "HEAD")
    assert provenance.git_state(project) == {"git_commit": commit, "git_dirty": False}
    (project / "Snakefile").write_text("# changed\n")
    assert provenance.git_state(project) == {"git_commit": commit, "git_dirty": True}


def test_a_workflow_in_a_subfolder_of_the_repository_that_tracks_it_names_the_commit(tmp_path, monkeypatch):
    """A monorepo: the workflow is one folder of a repository that tracks it: its commit is the
    workflow's, and only the workflow's folder decides whether it is dirty."""
    monkeypatch.delenv(provenance.GIT_COMMIT_ENV, raising=False)
    repo = tmp_path / "monorepo"
    workflow = _export_project(repo / "studies" / "scaling")
    (repo / "elsewhere.txt").write_text("x\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "all")
    (repo / "elsewhere.txt").write_text("changed\n")
    assert provenance.git_state(workflow) == {
        "git_commit": _git(repo, "rev-parse", "HEAD"),
        "git_dirty": False,
    }
