"""The study as a Workflow Run RO-Crate (scalestudy.crate), from a small study with Snakemake metadata
written as Snakemake writes it: every job an action with what it recorded, every file with its
sha256, roc-validator's REQUIRED level passed offline for every profile the crate declares, and an
edited crate (a file missing, a file changed) named by the check. The demo's own crate: test_workflow."""

from __future__ import annotations

import base64
import json
import os
import socket
import zipfile
from pathlib import Path

import pytest

from scalestudy.crate import __main__ as crate_cli
from scalestudy.crate import check, jobs, validation
from scalestudy.crate.write import write_crate
from scalestudy.data import file_digests
from scalestudy.plan import runfiles

POINT_REGEX = r"results/runs/scaling/(?P<point>[A-Za-z0-9_.=+-]+(/[A-Za-z0-9_.=+-]+)*)/summary\.json$"
RULES = {
    "fetch": {"output": [r"results/data/archive\.bin$"], "benchmark": None, "snakefile": "rules/study.smk"},
    "scaling_run": {
        "output": [POINT_REGEX, POINT_REGEX.replace("summary\\.json", "metrics\\.csv")],
        "benchmark": "results/benchmarks/scaling/{point,[A-Za-z0-9_.=+-]+(/[A-Za-z0-9_.=+-]+)*}.tsv",
        "snakefile": "rules/study.smk",
    },
    "figure_throughput": {
        "output": [r"results/figures/throughput\.png$"],
        "benchmark": None,
        "snakefile": "rules/study.smk",
        "retries": 0,  # a rule Snakemake never retries: a completed job took one attempt
    },
}
IMAGE_SHA = "ab" * 32
T0 = 1_790_000_000.0


def record(path: Path, name: str, rule: str, inputs, logs=(), start=0.0, end=10.0, jobid=None) -> None:
    """One output's metadata record, named as snakemake.persistence.file names it (long names split);
    a job's outputs share its hash and command (Snakemake's: the rule and the outputs, hashed)."""
    encoded = base64.urlsafe_b64encode(name.encode()).decode()
    parts = [encoded[i : i + 254] for i in range(0, len(encoded), 254)]
    target = path.joinpath(*["@" + p for p in parts[:-1]], parts[-1])
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(
        json.dumps(
            {
                "rule": rule,
                "input": list(inputs),
                "log": list(logs),
                "shellcmd": f"python -m something {rule} {' '.join(logs)}",
                "record_format_version": 6,
                "job_hash": hash((rule, tuple(inputs), tuple(logs))) & 0xFFFFFFF,
                "starttime": T0 + start,
                "endtime": T0 + end,
                "incomplete": False,
                "external_jobid": jobid,
            }
        )
    )


def run_folder(
    root: Path, point: str, energy: float | None, attempt: int, gpu_hours: float | None = None
) -> list[str]:
    folder = root / "results/runs/scaling" / point
    folder.mkdir(parents=True)
    results = {"world_size": 2, "device": "cuda", "total_time_s": 1800.0, "images_per_s": 1000.0}
    if gpu_hours is not None:  # the summary's own (runs.csv's), which the crate repeats
        results["gpu_hours"] = gpu_hours
    if energy is not None:
        results["energy_j"] = energy
    provenance = {
        "slurm": {"job_id": "4242", "job_nodelist": "gpu[01-02]"},
        "attempt": attempt,
        "image": "/images/scalestudy.sif",
        "image_sha256": IMAGE_SHA,
        "versions": {"python": "3.11.9", "torch": "2.14.1+cu130"},
    }
    (folder / "summary.json").write_text(
        json.dumps({"run": {}, "results": results, "provenance": provenance})
    )
    (folder / "metrics.csv").write_text("epoch,test_acc\n1,0.5\n")
    log = root / "results/logs/scaling" / f"{point}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("training\n")
    bench = root / "results/benchmarks/scaling" / f"{point}.tsv"
    bench.parent.mkdir(parents=True, exist_ok=True)
    bench.write_text("s\th:m:s\tmax_rss\tcpu_time\n1801.5\t0:30:01\t2048.0\t3500.0\n")
    return [str((folder / name).relative_to(root)) for name in ("summary.json", "metrics.csv")]


@pytest.fixture
def study(tmp_path, monkeypatch) -> Path:
    """A workflow folder after a run: sources, outputs, logs, benchmarks and Snakemake's metadata."""
    root = tmp_path / "study"
    (root / "rules").mkdir(parents=True)
    (root / "config").mkdir()
    (root / "Snakefile").write_text('include: "rules/study.smk"\n')
    (root / "rules/study.smk").write_text("rule fetch:\n    output: 'results/data/archive.bin'\n")
    (root / "config/study.yaml").write_text("study: {name: tiny}\n")
    (root / "results/data").mkdir(parents=True)
    (root / "results/data/archive.bin").write_bytes(os.urandom(2048))
    metadata = root / ".snakemake/metadata"
    record(metadata, "results/data/archive.bin", "fetch", [], start=0, end=5, jobid="100")
    measured = run_folder(root, "strong/w2_r0", energy=5.4e6, attempt=2)
    unmeasured = run_folder(root, "strong/w1_r0", energy=None, attempt=1, gpu_hours=0.25)
    for outputs, start in ((measured, 10), (unmeasured, 20)):
        point = outputs[0].split("scaling/")[1].rsplit("/", 1)[0]
        log = f"results/logs/scaling/{point}.log"
        for index, name in enumerate(outputs):  # Snakemake records each output's end on its own
            record(
                metadata,
                name,
                "scaling_run",
                ["results/data/archive.bin"],
                [log],
                start,
                start + 1800 + index * 0.001,
                "4242",
            )
    (root / "results/logs/scaling/strong/w2_r0.attempt1.log").write_text("killed at the time limit\n")
    os.link(
        root / "results/logs/scaling/strong/w2_r0.log",
        root / "results/logs/scaling/strong/w2_r0.attempt2.log",
    )
    (root / "results/figures").mkdir(parents=True)
    (root / "results/figures/throughput.png").write_bytes(b"\x89PNG figure")
    record(
        metadata,
        "results/figures/throughput.png",
        "figure_throughput",
        measured[:1] + unmeasured[:1],
        [],
        2000,
        2001,
    )
    stale = "results/runs/scaling/" + "x" * 300 + "/summary.json"  # a long name: split into folders
    record(metadata, stale, "scaling_run", [], [], 0, 1)
    monkeypatch.chdir(root)
    return root


def write(study: Path, **overrides) -> Path:
    arguments = dict(
        metadata_dir=".snakemake/metadata",
        targets=["results/figures/throughput.png"],
        rules=RULES,
        sources=["Snakefile", "rules/study.smk"],
        config_files=["config/study.yaml"],
        config={"study": {"name": "tiny"}},
        study={"name": "tiny", "title": "A tiny study", "license": "CC-BY-4.0", "author": "A. Researcher"},
    )
    arguments.update(overrides)
    write_crate(study / "results/crate", study / "results/crate.zip", **arguments)
    return study / "results/crate"


def entities(crate: Path) -> dict[str, dict]:
    return {e["@id"]: e for e in json.loads((crate / check.METADATA).read_text())["@graph"]}


def as_list(value):
    return value if isinstance(value, list) else [value]


def test_every_job_is_an_action_with_what_it_recorded(study):
    graph = entities(write(study))
    actions = {key: e for key, e in graph.items() if key.startswith("#job-")}
    assert set(actions) == {
        "#job-fetch",
        "#job-scaling_run:point=strong/w1_r0",
        "#job-scaling_run:point=strong/w2_r0",
        "#job-figure_throughput",
    }, "the stale record of no target's job is left out"
    run = actions["#job-scaling_run:point=strong/w2_r0"]
    assert run["instrument"] == {"@id": "#rule-scaling_run"} and run["@type"] == "CreateAction"
    assert run["startTime"] == jobs.iso_time(T0 + 10) and run["endTime"] == jobs.iso_time(T0 + 1810.001)
    assert (
        run["actionStatus"] == "http://schema.org/CompletedActionStatus" and run["location"] == "gpu[01-02]"
    )
    assert graph[run["identifier"]["@id"]]["value"] == "4242"
    image = graph[run["containerImage"]["@id"]]
    assert image["sha256"] == IMAGE_SHA and image["@type"] == "ContainerImage"
    usage = {graph[u["@id"]]["propertyID"]: graph[u["@id"]]["value"] for u in as_list(run["resourceUsage"])}
    assert usage["gpu_hours"] == pytest.approx(1.0) and usage["wall_time_s"] == 1801.5
    assert usage["max_rss_mb"] == 2048.0 and usage["attempts"] == 2 and usage["energy_j"] == 5.4e6
    other = actions["#job-scaling_run:point=strong/w1_r0"]
    other_usage = {
        graph[u["@id"]]["propertyID"]: graph[u["@id"]]["value"] for u in as_list(other["resourceUsage"])
    }
    assert other_usage["energy_j"] == runfiles.NOT_MEASURED and "energy not measured" in other["description"]
    assert other_usage["gpu_hours"] == 0.25  # the summary's, as runs.csv has it
    assert "Slurm job 100" in actions["#job-fetch"]["description"]
    # a job of the local executor: its host, and one attempt where the rule is never retried
    figure = actions["#job-figure_throughput"]
    figure_usage = {
        graph[u["@id"]]["propertyID"]: graph[u["@id"]]["value"] for u in as_list(figure.get("resourceUsage"))
    }
    assert figure["location"] == socket.gethostname() and figure_usage["attempts"] == 1
    assert "attempts 1" in figure["description"] and "(local executor)" in figure["description"]
    assert "attempts not recorded" in actions["#job-fetch"]["description"]  # retries unknown
    # one action per job, and the README and the study's run count them
    assert f"with {len(actions)} jobs." in (study / "results/crate/README.md").read_text()
    assert graph["#study-run"]["description"].endswith(f": {len(actions)} jobs")
    results = {r["@id"] for r in as_list(run["result"])}
    assert {
        "results/runs/scaling/strong/w2_r0/summary.json",
        "results/logs/scaling/strong/w2_r0.log",
        "results/logs/scaling/strong/w2_r0.attempt1.log",  # the attempt the time limit stopped
        "results/logs/scaling/strong/w2_r0.attempt2.log",
    } <= results
    controls = [e for e in graph.values() if e.get("@type") == "ControlAction"]
    assert len(controls) == 4 and all(graph[c["instrument"]["@id"]]["@type"] == "HowToStep" for c in controls)


def test_files_carry_checksums_and_the_figure_names_its_jobs(study):
    crate = write(study)
    graph = entities(crate)
    files = {key: e for key, e in graph.items() if "File" in as_list(e.get("@type"))}
    assert {
        "Snakefile",
        "config/study.yaml",
        "config.json",
        "README.md",
        "results/data/archive.bin",
        "results/benchmarks/scaling/strong/w2_r0.tsv",
    } <= set(files)
    for name, entity in files.items():
        assert entity["sha256"] == file_digests(crate / name, ("sha256",))["sha256"], name
    figure = graph["results/figures/throughput.png"]
    assert "#job-figure_throughput" in figure["description"]
    assert "#job-scaling_run:point=strong/w2_r0" in figure["description"]
    assert {b["@id"] for b in as_list(figure["isBasedOn"])} == {
        "results/runs/scaling/strong/w2_r0/summary.json",
        "results/runs/scaling/strong/w1_r0/summary.json",
    }
    assert graph["#config-hash"]["value"] and graph["./"]["mainEntity"] == {"@id": "Snakefile"}
    with zipfile.ZipFile(study / "results/crate.zip") as archive:
        assert set(files) | {check.METADATA} <= set(archive.namelist())


def test_the_crate_passes_every_declared_profile_at_the_required_level_offline(study, tmp_path):
    crate = write(study)
    profiles = validation.declared_profiles(crate)
    assert profiles == [
        "ro-crate-1.1",
        "workflow-ro-crate-1.0",
        "process-run-crate-0.5",
        "workflow-run-crate-0.5",
        "provenance-run-crate-0.5",
    ]
    to_run = validation.profiles_to_run(profiles)
    assert to_run == {"provenance-run-crate-0.5": profiles}  # it inherits the other four
    cache = validation.seed_cache(tmp_path / "contexts")
    report = validation.validate(
        crate, "provenance-run-crate-0.5", "REQUIRED", offline=True, cache_path=cache
    )
    assert report.passed, report.issues


def test_a_broken_rule_of_an_inherited_profile_fails_the_inheriting_profiles_validation(study, tmp_path):
    """The validator does look, and what profiles_to_run counts on: a crate whose workflow run names no
    instrument fails Process Run Crate, and Provenance Run Crate (which inherits it) with that issue."""
    crate = write(study)
    metadata = json.loads((crate / check.METADATA).read_text())
    del next(entity for entity in metadata["@graph"] if entity["@id"] == "#job-fetch")["instrument"]
    (crate / check.METADATA).write_text(json.dumps(metadata))
    cache = validation.seed_cache(tmp_path / "contexts")
    alone = validation.validate(crate, "process-run-crate-0.5", "REQUIRED", True, cache)
    inherited = validation.validate(crate, "provenance-run-crate-0.5", "REQUIRED", True, cache)
    assert not alone.passed and any("instrument" in issue for issue in alone.issues), alone.issues
    assert not inherited.passed
    assert set(alone.issues) <= set(inherited.issues), set(alone.issues) - set(inherited.issues)


def test_an_edited_crate_is_named_file_by_file(study, capsys):
    crate = write(study)
    assert check.problems(crate) == []
    (crate / "results/runs/scaling/strong/w2_r0/metrics.csv").unlink()
    changed = crate / "results/runs/scaling/strong/w1_r0/summary.json"
    changed.unlink()  # a hard link to the study's file: break it before changing the crate's copy
    changed.write_text("{}")
    found = check.problems(crate)
    assert len(found) == 2
    assert "results/runs/scaling/strong/w2_r0/metrics.csv" in found[1] and "missing" in found[1]
    assert "results/runs/scaling/strong/w1_r0/summary.json" in found[0] and "sha256" in found[0]
    assert crate_cli.main(["check", str(crate)]) == 1
    assert "metrics.csv" in capsys.readouterr().err
    assert crate_cli.main(["check", str(study / "results/crate.zip")]) == 0, "the zip was written before"


def test_excluded_files_are_described_not_carried_and_the_old_crate_survives_a_failure(study):
    crate = write(study, exclude=["results/data/*"])
    graph = entities(crate)
    assert not (crate / "results/data/archive.bin").exists()
    described = graph["#excluded/results/data/archive.bin"]
    assert described["contentSize"] == "2048" and len(described["sha256"]) == 64
    before = (crate / check.METADATA).read_text()
    with pytest.raises(ValueError, match="missing"):
        write(study, targets=["results/figures/nowhere.png"])
    assert (crate / check.METADATA).read_text() == before


def test_wildcards_and_benchmarks_from_the_rules_patterns():
    regex = RULES["scaling_run"]["output"][0]
    assert jobs.wildcards_of(["results/runs/scaling/weak/fsdp-w8_r2/summary.json"], [regex]) == {
        "point": "weak/fsdp-w8_r2"
    }
    pattern = RULES["scaling_run"]["benchmark"]
    assert (
        jobs.fill_wildcards(pattern, {"point": "weak/w8_r2"}) == "results/benchmarks/scaling/weak/w8_r2.tsv"
    )
    assert jobs.fill_wildcards(pattern, {}) is None


def test_offline_contexts_are_the_published_ones():
    ro_crate = validation.context_document(validation.RO_CRATE_CONTEXT)
    assert (
        ro_crate["@id"] == validation.RO_CRATE_CONTEXT
        and ro_crate["@context"]["File"] == "http://schema.org/MediaObject"
    )
    terms = validation.context_document(validation.WORKFLOW_RUN_CONTEXT)["@context"]
    assert terms["containerImage"] == "https://w3id.org/ro/terms/workflow-run#containerImage"
    with pytest.raises(ValueError, match="no offline copy"):
        validation.context_document("https://example.org/context")


def test_a_missing_metadata_folder_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="no Snakemake metadata"):
        jobs.read_records(tmp_path / "nowhere")


def test_validate_without_network_serves_the_packaged_contexts_and_says_so(study, monkeypatch, capsys):
    """No network (as on a compute node): the contexts come from the package, with one line saying so;
    a validator that fails anyway (here: --online where nothing answers) is one line, never a traceback."""
    write(study)
    zipped = str(study / "results/crate.zip")
    capsys.readouterr()  # what writing it logged
    monkeypatch.setattr(validation, "network_problem", lambda: "https://w3id.org/... cannot be fetched")
    assert crate_cli.main(["validate", zipped]) == 0
    out, err = capsys.readouterr()
    assert "the JSON-LD contexts from the package (--online to insist)" in out
    assert "provenance-run-crate-0.5 at REQUIRED" in out and ": passed" in out and err == ""

    def unreachable(*args, **kwargs):
        raise ConnectionError("<urlopen error [Errno -2] Name or service not known>\nTraceback (most recent")

    monkeypatch.setattr(validation, "validate", unreachable)
    assert crate_cli.main(["validate", zipped, "--online"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"crate validate: {zipped}: ConnectionError: <urlopen error") and "--offline" in err


def test_a_tampered_zip_is_named_by_the_zip_one_line_per_file(study, tmp_path, capsys):
    write(study)
    capsys.readouterr()  # what writing it logged
    tampered = tmp_path / "tampered.zip"
    with zipfile.ZipFile(study / "results/crate.zip") as original, zipfile.ZipFile(tampered, "w") as copy:
        for item in original.infolist():
            data = original.read(item)
            if item.filename == "results/runs/scaling/strong/w1_r0/metrics.csv":
                data += b"2,0.9\n"
            if item.filename != "results/data/archive.bin":
                copy.writestr(item, data)
    assert crate_cli.main(["check", str(tampered)]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and all(line.startswith(f"crate check: {tampered}: results/") for line in lines)
    assert "scalestudy-crate-" not in "".join(lines)  # not the folder it was extracted to
    (tmp_path / "not.zip").write_bytes(b"PK\x03\x04 cut short")
    assert crate_cli.main(["check", str(tmp_path / "not.zip")]) == 1
    assert capsys.readouterr().err.count("\n") == 1


def test_the_report_is_added_to_a_written_crate_and_its_zip(study, capsys):
    crate = write(study)
    report = study / "results/report.html"
    report.write_text("<html>the study's report</html>\n")
    zipped = study / "results/crate.zip"
    assert crate_cli.main(["add", str(crate), "--zip", str(zipped), "results/report.html"]) == 0
    graph = entities(crate)
    assert graph["results/report.html"]["sha256"] == file_digests(report, ("sha256",))["sha256"]
    assert {"@id": "results/report.html"} in as_list(graph["./"]["hasPart"])
    assert crate_cli.main(["check", str(zipped)]) == 0
    assert crate_cli.main(["add", str(crate), "--zip", str(zipped), "results/nowhere.html"]) == 2
    assert "nowhere.html" in capsys.readouterr().err


def run_record(study: Path, started: float) -> dict:
    """The run's jobs as scalestudy.crate.record_run_jobs writes them: two of the study's, the crate's
    own, a job that ended in the run before the crate (its record), one beside it and `all`."""
    (study / "results/tables").mkdir(parents=True)
    (study / "results/tables/early.csv").write_text("a\n1\n")
    record(study / ".snakemake/metadata", "results/tables/early.csv", "early", [], [], 3000, 3001)
    entries = [
        ("fetch", ["results/data/archive.bin"], []),
        ("figure_throughput", ["results/figures/throughput.png"], []),
        ("crate", ["results/crate", "results/crate.zip"], ["results/logs/crate.log"]),
        ("early", ["results/tables/early.csv"], []),
        ("track", ["results/logs/tracking/sync.json"], ["results/logs/tracking/sync.log"]),
        ("all", [], []),
    ]
    jobs_ = [{"rule": r, "wildcards": {}, "outputs": o, "logs": lg, "local": True} for r, o, lg in entries]
    return {"started": started, "jobs": jobs_}


def test_every_job_of_the_run_is_in_the_crate_with_its_state(study):
    """The crate's own job (running, its result the crate), one that ended in the run before it (its
    record), and those not yet finished (beside and after it: track, all) are actions too; the
    study's jobs are not listed twice."""
    rules = RULES | {"crate": {"output": [r"results/crate$", r"results/crate\.zip$"], "retries": 0}}
    graph = entities(write(study, run_jobs=run_record(study, T0 + 2500), rules=rules))
    actions = {key: e for key, e in graph.items() if key.startswith("#job-")}
    assert {"#job-crate", "#job-early", "#job-track", "#job-all", "#job-fetch"} <= set(actions)
    assert len(actions) == 4 + 4
    own = actions["#job-crate"]
    assert own["actionStatus"] == "http://schema.org/ActiveActionStatus" and own["result"] == {"@id": "./"}
    assert "startTime" in own and "endTime" not in own and jobs.WRITING_THE_CRATE in own["description"]
    assert "attempts 1" in own["description"]  # this one: a rule never retried
    assert own["location"] == socket.gethostname()  # it runs here, now
    early = actions["#job-early"]
    assert early["actionStatus"] == "http://schema.org/CompletedActionStatus"
    assert early["endTime"] == jobs.iso_time(T0 + 3001)
    for later in ("#job-track", "#job-all"):
        assert actions[later]["actionStatus"] == "http://schema.org/PotentialActionStatus"
        assert jobs.NOT_FINISHED in actions[later]["description"] and "startTime" not in actions[later]
    assert f"with {len(actions)} jobs." in (study / "results/crate/README.md").read_text()
    assert graph["#study-run"]["actionStatus"] == "http://schema.org/ActiveActionStatus"
    assert not (study / "results/crate/results/tables/early.csv").exists()  # not the study's output
    # a record of an earlier run is no job of this one: before the run started, it is "not finished"
    graph = entities(write(study, run_jobs=run_record(study.parent / "other", T0 + 5000) | {"jobs": []}))
    assert "#job-early" not in graph and "#job-crate" not in graph


def test_the_run_is_recorded_when_it_starts_and_read_by_the_crates_job(study, monkeypatch):
    """rules/crate.smk's onstart hook: the run's jobs from Snakemake's DAG into RUN_JOBS, named in
    the environment its jobs inherit; `crate write` reads it from there (and never outside a run)."""
    from types import SimpleNamespace

    import scalestudy.crate as crate_package

    monkeypatch.setenv(crate_package.RUN_JOBS_ENV, "")  # restored (absent) after the test
    job = SimpleNamespace(
        rule=SimpleNamespace(name="track"),
        wildcards_dict={},
        output=["results/logs/tracking/sync.json"],
        log=["results/logs/tracking/sync.log"],
        is_local=True,
    )
    crate_package.record_run_jobs([job], path="run-jobs.json")
    written = json.loads(Path("run-jobs.json").read_text())
    assert written["jobs"][0]["rule"] == "track" and written["started"] > T0 and written["jobs"][0]["local"]
    assert os.environ[crate_package.RUN_JOBS_ENV] == "run-jobs.json"
    assert crate_cli._run_jobs(None) == written
    monkeypatch.delenv(crate_package.RUN_JOBS_ENV)
    assert crate_cli._run_jobs(None) is None


def tampered_copy(zipped: Path, dest: Path, name: str) -> Path:
    """A copy of a crate's zip with the file `name` changed inside."""
    with zipfile.ZipFile(zipped) as original, zipfile.ZipFile(dest, "w") as copy:
        for item in original.infolist():
            data = original.read(item)
            copy.writestr(item, data + b"9,0.1\n" if item.filename == name else data)
    return dest


def test_validate_checks_every_files_bytes_naming_a_changed_one(study, tmp_path, monkeypatch, capsys):
    """Issue 54: a zip with one file changed inside fails `validate` (exit 1) naming the file, though
    its metadata passes every profile; --metadata-only passes it and its line says the bytes were not
    checked; the untouched crate passes and says how many files were checked."""
    write(study)
    monkeypatch.setattr(validation, "network_problem", lambda: "offline for the test")
    changed = "results/runs/scaling/strong/w1_r0/metrics.csv"
    tampered = tampered_copy(study / "results/crate.zip", tmp_path / "tampered.zip", changed)
    capsys.readouterr()
    assert crate_cli.main(["validate", str(tampered)]) == 1
    out, err = capsys.readouterr()
    assert (
        err.splitlines()
        == [
            line
            for line in err.splitlines()
            if line.startswith(f"crate validate: {tampered}: {changed}: sha256")
        ]
        and len(err.splitlines()) == 1
    )
    verdict = [line for line in out.splitlines() if line.startswith("provenance-run-crate-0.5")]
    assert verdict and ": passed; files: FAILED: 1 file(s) missing or changed" in verdict[0]
    assert crate_cli.main(["validate", str(tampered), "--metadata-only"]) == 0
    assert "files: the files' bytes not checked (--metadata-only)" in capsys.readouterr().out
    assert crate_cli.main(["validate", str(study / "results/crate.zip")]) == 0
    files = len(check.listed_files(study / "results/crate"))
    assert f"files: {files} files, each with its recorded sha256" in capsys.readouterr().out


def test_snakemakes_folder_markers_are_not_in_the_crate_or_its_zip(study):
    """A directory() output holds Snakemake's empty .snakemake_timestamp; so does the crate folder
    once its job ended (before `crate add` zips it again): neither is carried, listed or zipped."""
    folder = study / "results/profile/w1/nsys_stats"
    folder.mkdir(parents=True)
    (folder / "kernels.csv").write_text("kernel,ms\nk,1\n")
    (folder / ".snakemake_timestamp").write_text("")
    crate = write(study, targets=["results/figures/throughput.png", "results/profile/w1/nsys_stats"])
    (crate / ".snakemake_timestamp").write_text("")  # what Snakemake leaves once rule crate ended
    (study / "results/report.html").write_text("<html></html>\n")
    assert (
        crate_cli.main(["add", str(crate), "--zip", str(study / "results/crate.zip"), "results/report.html"])
        == 0
    )
    with zipfile.ZipFile(study / "results/crate.zip") as archive:
        names = archive.namelist()
    assert "results/profile/w1/nsys_stats/kernels.csv" in names
    assert not [name for name in names if name.endswith(".snakemake_timestamp")], names
    assert not [key for key in entities(crate) if key.endswith(".snakemake_timestamp")]


@pytest.mark.filterwarnings("ignore:.*found in sys.modules after import of package:RuntimeWarning")
def test_the_json_options_take_a_file_and_the_help_names_the_module(study, tmp_path, capsys):
    """rules/crate.smk passes its JSON as @FILE (scalestudy.commandline.json_file: named by content);
    a bad file is one line naming it. --help: "python -m scalestudy.crate", as run."""
    import runpy
    import sys

    from scalestudy import commandline

    first = commandline.json_file({"study": {"name": "tiny"}}, "config", tmp_path / "json")
    assert first == commandline.json_file({"study": {"name": "tiny"}}, "config", tmp_path / "json")
    assert first != commandline.json_file({"study": {"name": "other"}}, "config", tmp_path / "json")
    assert commandline.json_argument(first, "--config-json") == {"study": {"name": "tiny"}}
    with pytest.raises(ValueError, match="--config-json: .*nowhere.json"):
        commandline.json_argument("@" + str(tmp_path / "nowhere.json"), "--config-json")
    argv = ["write", "--out-dir", "results/crate", "--zip", "results/crate.zip", "--metadata-dir"]
    argv += [".snakemake/metadata", "--targets", "results/figures/throughput.png", "--sources", "Snakefile"]
    argv += ["--rules-json"]
    argv += [commandline.json_file(RULES, "rules", tmp_path / "json"), "--config-json", first]
    argv += [
        "--study-json",
        commandline.json_file({"name": "tiny", "license": "MIT"}, "s", tmp_path / "json"),
    ]
    assert crate_cli.main(argv) == 0
    assert json.loads((study / "results/crate/config.json").read_text()) == {"study": {"name": "tiny"}}
    capsys.readouterr()
    for module in ("scalestudy.crate", "scalestudy.analysis.metrics", "scalestudy.paper.numbers"):
        sys_argv = sys.argv
        sys.argv = [module, "--help"]
        try:
            with pytest.raises(SystemExit):
                runpy.run_module(module, run_name="__main__", alter_sys=True)
        finally:
            sys.argv = sys_argv
        assert capsys.readouterr().out.startswith(f"usage: python -m {module} "), module
