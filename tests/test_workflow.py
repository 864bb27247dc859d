"""The whole demo study through Snakemake: every declared output, the report, partial re-runs.

One complete demo run (README command 1, `bash scripts/demo.sh`, in a copy of the repository) is
shared by the tests of this module; it takes a few minutes on 2 cores.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from scalestudy.benchmark import dag
from tests.conftest import REPO, copy_workflow, run_snakemake, snakemake_env, write_config

pytestmark = pytest.mark.slow

# Secrets in the environment of the demo run and of the refused runs of
# test_no_secret_reaches_any_file_of_the_study_or_its_console: none may reach a file or the console.
ENV_CANARIES = {
    "AWS_SECRET_ACCESS_KEY": "CANARYaws5h2k8w",
    "MLFLOW_TRACKING_USERNAME": "CANARYuser3m1z",
    "MLFLOW_TRACKING_PASSWORD": "CANARYmlflow3j6d",
    "MLFLOW_TRACKING_TOKEN": "CANARYtoken8r2p",
    "HF_TOKEN": "hf_CANARYhf9x4m",
}
URL_CANARY = "CANARYurl4q7wz"  # in the URLs of a config the workflow must refuse
CONSOLE = "demo-console.txt"  # beside the demo's copy: what demo.sh printed


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory) -> Path:
    """README command 1 in a copy of the repository (sharing this environment's .venv), with
    ENV_CANARIES in its environment; what it printed is CONSOLE beside the copy."""
    workdir = copy_workflow(tmp_path_factory.mktemp("demo") / "scalestudy")
    shutil.copytree(REPO / "scripts", workdir / "scripts")
    shutil.copy2(REPO / "pyproject.toml", workdir / "pyproject.toml")
    (workdir / ".venv").symlink_to(Path(os.environ.get("VIRTUAL_ENV", REPO / ".venv")))
    result = subprocess.run(
        ["bash", "scripts/demo.sh"],
        cwd=workdir,
        env={**snakemake_env(), **ENV_CANARIES},
        capture_output=True,
        text=True,
        timeout=1500,
    )
    (workdir.parent / CONSOLE).write_text(result.stdout + result.stderr)
    assert result.returncode == 0, f"demo failed:\n{result.stdout[-6000:]}\n{result.stderr[-8000:]}"
    (workdir.parent / CONSOLE).write_text(result.stdout + result.stderr)  # what a person saw
    return workdir


CONSOLE = "demo-console.txt"  # beside the demo's folder: the demo's console, stdout then stderr


def test_the_demos_console_is_short_and_ends_in_its_summary(demo_run):
    """Issue 54: at most ~150 lines, none over 300 characters, no shell command, one line per
    finished job ("N of M steps"), and the closing summary: where the report, paper, crate and tables
    are, the headline numbers as results/tables has them, and MLflow's command and link. The commands
    are in the jobs' own logs."""
    import pandas as pd

    lines = (demo_run.parent / CONSOLE).read_text().splitlines()
    assert len(lines) <= 150, "\n".join(lines)
    assert not [line for line in lines if len(line) > 300], [line[:200] for line in lines if len(line) > 300]
    assert not [line for line in lines if line.startswith(("Shell command", "Adding ", "localrule "))]
    total = dag.planned_jobs(next(iter(sorted((demo_run / ".snakemake/log").glob("*.log")))).read_text())
    steps = [line for line in lines if re.match(rf"^\[\d\d:\d\d:\d\d\] \d+ of {total} steps", line)]
    assert len(steps) == total and steps[-1].endswith(f"{total} of {total} steps (100%) done: all"), steps
    start = next(i for i, line in enumerate(lines) if line.startswith("demo: done in "))
    closing = lines[start:]
    assert closing[1] == "  report: results/report.html" and closing[2].startswith(
        "  paper:  results/paper/paper."
    )
    assert (
        closing[3].startswith("  crate:  results/crate.zip (")
        and "python -m scalestudy.crate validate" in closing[3]
    )
    assert closing[4] == "  tables: results/tables/ (12 CSV files; runs.csv: 15 runs)", closing
    scaling = pd.read_csv(demo_run / "results/tables/scaling.csv").set_index(["mode", "world_size"])
    strong = f"{scaling.loc[('strong', 2), 'images_per_s_mean']:,.0f} at N=2"
    efficiency = f"efficiency {100 * scaling.loc[('strong', 2), 'efficiency_mean']:.1f} %"
    assert any(
        line.startswith("  strong scaling (ddp): ") and strong in line and efficiency in line
        for line in closing
    )
    assert closing[-2].startswith("MLflow: MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false mlflow ui --workers 1")
    assert closing[-1].startswith("  then open http://127.0.0.1:5000/#/experiments/")
    assert (
        "command: python -m scalestudy.data.fetch --source synthetic"
        in ((demo_run / "results/logs/fetch.log").read_text().splitlines()[0])
    )


def declared_outputs(workdir: Path) -> list[tuple[str, str]]:
    """(path, rule) for every output file of the study's DAG, from `snakemake --summary`."""
    result = run_snakemake(workdir, "--summary")
    rows = [line.split("\t") for line in result.stdout.splitlines()]
    header_index = next(i for i, row in enumerate(rows) if row[0] == "output_file")
    return [(row[0], row[2]) for row in rows[header_index + 1 :] if len(row) > 2]


def test_every_declared_output_exists_and_is_not_empty(demo_run):
    outputs = declared_outputs(demo_run)
    assert len(outputs) > 40
    for path, rule in outputs:
        target = demo_run / path
        assert target.exists(), f"{path} (rule {rule}) is missing"
        if target.is_file():
            assert target.stat().st_size > 0, f"{path} (rule {rule}) is empty"


def test_nothing_is_left_to_do_after_a_complete_run(demo_run):
    result = run_snakemake(demo_run, "--dry-run")
    assert "Nothing to be done" in result.stdout + result.stderr


def test_report_has_every_figure(demo_run):
    report = (demo_run / "results/report.html").read_text(errors="replace")
    figures = [path for path, _ in declared_outputs(demo_run) if path.endswith(".png")]
    assert figures, "the study declares no figures"
    missing = [path for path in figures if os.path.basename(path) not in report]
    assert not missing, f"figures not in the report: {missing}"


def test_the_reference_names_every_column_of_the_demos_tables_and_every_figure(demo_run):
    """docs/reference/tables.md names every column of every table the demo wrote, and figures.md
    every figure (tests/reference_pages.py reads the pages)."""
    from tests.reference_pages import CODE, FIGURES_PAGE, undocumented_columns

    assert len(list((demo_run / "results/tables").glob("*.csv"))) >= 10
    assert undocumented_columns(demo_run / "results/tables") == {}
    figures = {path.stem for path in (demo_run / "results/figures").glob("*.png")}
    assert len(figures) >= 12
    assert figures - set(CODE.findall(FIGURES_PAGE.read_text())) == set()


def test_the_demo_fills_the_embedded_mlflow_store(demo_run):
    from tests.tracking_runs import check_demo_store

    check_demo_store(demo_run)


def test_every_run_records_its_provenance(demo_run):
    summaries = sorted((demo_run / "results/runs").rglob("summary.json"))
    assert len(summaries) >= 15
    for path in summaries:
        provenance = json.loads(path.read_text())["provenance"]
        assert provenance["git_commit"] and provenance["config_hash"] and provenance["versions"]["torch"]
        assert provenance["seed"] is not None and provenance["host"]


def test_the_local_demo_says_what_ran_it_names_no_slurm_and_gives_no_mfu_against_a_placeholder(demo_run):
    """Issue 54: the paper and the report say the local executor ran the demo and name no Slurm;
    its CPU ranks have no known peak, so MFU is n/a with the reason, never 28 % of a placeholder;
    the paper's sentences read as English ("not measured" said once, no time "after not reached")."""
    import pandas as pd

    from tests.paper_text import broken, paper_and_report, sentences

    paper, report = paper_and_report(demo_run)
    assert "slurm" not in paper.lower(), [s for s in sentences(paper) if "slurm" in s.lower()]
    assert "Slurm" not in report, re.findall(r".{80}Slurm.{80}", report)
    said = "local executor ran every job of this study"
    assert (
        said in paper
        and f"{said} on one machine" in report
        and "scales on one machine," in " ".join(paper.split())
    )
    assert "format).The" not in report and "in its format). The workflow generated" in " ".join(
        report.split()
    )
    assert not [(s, broken(s)) for s in sentences(paper) if broken(s)]
    scaling = pd.read_csv(demo_run / "results/tables/scaling.csv")
    assert scaling["mfu_mean"].isna().all() and scaling["mfu_note"].str.contains("placeholder").all()
    assert "MFU n/a: analysis.peak\\_tflops.cpu is the schema's placeholder" in paper


def test_the_demo_says_energy_was_not_measured_and_why(demo_run):
    """CPU ranks: no NVML, no RAPL. Every energy column of runs.csv, the scaling table and the resource
    estimate is empty with the reason beside it, never a zero; the figure and the paper say so."""
    import pandas as pd

    from scalestudy.analysis import energy

    tables = demo_run / "results/tables"
    runs = pd.read_csv(tables / "runs.csv")
    reason = f"not measured: no NVIDIA GPU (device cpu); {energy.NO_CPU_ENERGY}"  # ... no CPU energy (RAPL)
    assert "RAPL" in reason and (runs["energy_source"] == reason).all(), runs["energy_source"].unique()
    for column in ("energy_j", "energy_window_j", "mean_power_w", "joules_per_sample", "energy_to_target_j"):
        assert runs[column].isna().all(), column
    assert (runs["gpu_hours"] > 0).all() and runs["sacct.energy_consumed_j"].isna().all()
    scaling = pd.read_csv(tables / "scaling.csv")
    assert (scaling["energy_source"] == reason).all() and scaling["joules_per_sample_mean"].isna().all()
    estimate = pd.read_csv(tables / "resource_estimate.csv")
    assert estimate["kwh"].isna().all() and estimate["energy_source"].str.startswith("not measured").all()
    assert (demo_run / "results/figures/energy.png").stat().st_size > 0
    numbers_tex = (demo_run / "results/paper/numbers.tex").read_text()
    assert "\\newcommand{\\EnergySource}{nothing: energy was not measured: no NVIDIA GPU" in numbers_tex
    assert "\\section{Energy}" in (demo_run / "results/paper/paper.tex").read_text()


def test_the_machine_is_described_and_checked_before_any_training_job(demo_run):
    import socket

    import pandas as pd

    system = pd.read_csv(demo_run / "results/tables/system.csv")
    assert socket.gethostname() in set(system["host"])
    assert len(pd.read_csv(demo_run / "results/tables/smoke.csv")) >= 2
    busbw = pd.read_csv(demo_run / "results/comm/busbw.csv")
    assert {"all_reduce", "all_gather", "reduce_scatter"} <= set(busbw["collective"])
    assert (busbw["busbw_gb_s"] > 0).all()
    first_training = min(path.stat().st_mtime for path in (demo_run / "results/runs").rglob("summary.json"))
    gates = [*(demo_run / "results/site").glob("*.json"), demo_run / "results/smoke/all.passed"]
    gates.append(demo_run / "results/gates/training.ok")
    assert all(gate.is_file() for gate in gates)
    assert all(gate.stat().st_mtime < first_training for gate in gates)


def test_the_demos_waterfall_adds_up_from_its_raw_measurements_and_the_paper_quotes_it(demo_run):
    """results/tables/waterfall.csv of the real demo (gloo on CPU ranks): each row's parts and
    remainder add up to its loss, each part is what runs.csv's step parts and the profile's overlap
    give, host overhead is not measured on the CPU; the figure is drawn and paper.tex's paragraph
    quotes numbers.tex's macros, naming a remainder beyond 10 % of the loss."""
    import pandas as pd

    from tests.waterfall_checks import check_cpu_waterfall, check_cpu_waterfall_paper

    tables, paper = demo_run / "results/tables", demo_run / "results/paper"
    waterfall = pd.read_csv(tables / "waterfall.csv")
    overlap = pd.read_csv(demo_run / "results/profile/overlap.csv")
    check_cpu_waterfall(
        pd.read_csv(tables / "runs.csv"), pd.read_csv(tables / "scaling.csv"), overlap, waterfall
    )
    assert (waterfall["unexplained_share_max"] == 0.1).all()
    check_cpu_waterfall_paper(
        waterfall, (paper / "numbers.tex").read_text(), (paper / "paper.tex").read_text()
    )
    assert (paper / "figures/waterfall.pdf").stat().st_size > 0
    assert "waterfall.png" in (demo_run / "results/report.html").read_text(errors="replace")


def test_the_demo_crate_passes_every_profile_it_declares_at_the_required_level(demo_run, tmp_path):
    """roc-validator, offline (the crate's JSON-LD contexts from the package), against every profile the
    demo's crate declares: no error at REQUIRED; the RECOMMENDED issues are printed (pytest -s)."""
    from scalestudy.crate import check, validation

    crate = demo_run / "results/crate"
    assert (demo_run / "results/crate.zip").stat().st_size > 0
    assert check.problems(crate) == []
    cache = validation.seed_cache(tmp_path / "contexts")
    profiles = validation.declared_profiles(crate)
    assert "provenance-run-crate-0.5" in profiles and len(profiles) == 5
    to_run = validation.profiles_to_run(profiles)
    assert sorted(sum(to_run.values(), [])) == sorted(profiles)  # every declared profile checked
    for profile, covered in to_run.items():
        # one pass at RECOMMENDED runs the REQUIRED checks too: none of those may fail
        report = validation.validate(crate, profile, "RECOMMENDED", offline=True, cache_path=cache)
        required = [issue for issue in report.issues if issue.startswith("REQUIRED")]
        assert not required, (profile, required)
        print(f"{profile} (with {covered}): REQUIRED passed; RECOMMENDED issues: {len(report.issues)}")
        for issue in sorted({issue.split(" (")[0] for issue in report.issues}):
            print(f"  {issue}")


def test_the_demo_crate_has_one_action_per_job_of_the_study(demo_run):
    graph = json.loads((demo_run / "results/crate/ro-crate-metadata.json").read_text())["@graph"]
    actions = [e for e in graph if e["@id"].startswith("#job-")]
    by_rule = {}
    for action in actions:
        by_rule.setdefault(action["instrument"]["@id"].removeprefix("#rule-"), []).append(action)
    # every job of the run (Snakemake's job-stats table), the crate's own and those after it included
    first_log = next(iter(sorted((demo_run / ".snakemake/log").glob("*.log")))).read_text()
    assert {rule: len(found) for rule, found in by_rule.items()} == dag.job_counts(first_log)
    assert by_rule["crate"][0]["actionStatus"] == "http://schema.org/ActiveActionStatus"
    assert len(by_rule["scaling_run"]) == 4 and len(by_rule["sensitivity_run"]) == 8
    run = by_rule["scaling_run"][0]
    assert run["startTime"] < run["endTime"] and "energy not measured" in run["description"]
    # the README counts the actions; every local job has its host and attempts; GPU-hours are runs.csv's
    import pandas as pd

    readme = (demo_run / "results/crate/README.md").read_text()
    assert f"with {len(actions)} jobs." in readme, readme[:400]
    from scalestudy.crate.jobs import NOT_FINISHED, WRITING_THE_CRATE

    unfinished = {a["@id"] for a in actions if NOT_FINISHED in a["description"]}
    assert unfinished <= {"#job-track", "#job-all"} and "#job-all" in unfinished
    assert [a["@id"] for a in actions if WRITING_THE_CRATE in a["description"]] == ["#job-crate"]
    assert (
        not [  # attempts, nodes: recorded for every job that ended, and the crate's own
            a["@id"] for a in actions if "not recorded" in a["description"] and a["@id"] not in unfinished
        ]
    )
    entities = {e["@id"]: e for e in graph}
    hours = pd.read_csv(demo_run / "results/tables/runs.csv").set_index("run_dir")["gpu_hours"]
    for action in by_rule["scaling_run"] + by_rule["sensitivity_run"]:
        results = {r["@id"] for r in action["result"]}
        (summary,) = [path for path in results if path.endswith("/summary.json")]
        usage = {
            entities[u["@id"]]["propertyID"]: entities[u["@id"]]["value"] for u in action["resourceUsage"]
        }
        assert usage["gpu_hours"] == pytest.approx(hours[summary.rsplit("/", 1)[0]], rel=1e-12)
    kept = sorted(str(p.relative_to(demo_run)) for p in (demo_run / "results/logs").rglob("*.attempt*.log"))
    assert kept and set(kept) <= set(entities), "every kept attempt log is in the crate"
    assert "results/report.html" in entities  # scripts/demo.sh adds it after the report


def test_an_edited_demo_crate_fails_validation_or_comparison_naming_the_file(demo_run, tmp_path, capsys):
    """A missing output fails roc-validator's REQUIRED level, naming it; a changed file fails the
    crate's check and the comparison, naming it."""
    from scalestudy.compare import __main__ as compare_cli
    from scalestudy.crate import validation

    missing = tmp_path / "missing"
    shutil.copytree(demo_run / "results/crate", missing)
    (missing / "results/figures/throughput.png").unlink()
    cache = validation.seed_cache(tmp_path / "contexts")
    report = validation.validate(
        missing, "provenance-run-crate-0.5", "REQUIRED", offline=True, cache_path=cache
    )
    assert not report.passed and any("results/figures/throughput.png" in i for i in report.issues), (
        report.issues
    )

    changed = tmp_path / "changed"
    shutil.copytree(demo_run / "results/crate", changed)
    runs = changed / "results/tables/runs.csv"
    runs.write_text(runs.read_text().replace(",", ";", 1))
    assert compare_cli.main([str(demo_run / "results"), str(changed)]) == 2
    error = capsys.readouterr().err
    assert "results/tables/runs.csv" in error and "sha256" in error

    # Issue 54: a copy of crate.zip with runs.csv changed inside fails `crate validate`, naming it
    import zipfile

    from scalestudy.crate import __main__ as crate_cli

    tampered = tmp_path / "tampered.zip"
    with zipfile.ZipFile(demo_run / "results/crate.zip") as original, zipfile.ZipFile(tampered, "w") as copy:
        names = original.namelist()
        for item in original.infolist():
            data = original.read(item)
            copy.writestr(
                item, data.replace(b",", b";", 1) if item.filename == "results/tables/runs.csv" else data
            )
    assert not [name for name in names if name.endswith(".snakemake_timestamp")], "Snakemake's markers"
    assert crate_cli.main(["validate", str(tampered), "--offline"]) == 1
    out, err = capsys.readouterr()
    assert (
        err.startswith(f"crate validate: {tampered}: results/tables/runs.csv: sha256 ")
        and err.count("\n") == 1
    )
    assert "files: FAILED: 1 file(s) missing or changed" in out


def test_the_demo_compared_with_its_own_crate_differs_nowhere(demo_run, tmp_path):
    import pandas as pd

    from scalestudy.compare import __main__ as compare_cli

    table = tmp_path / "comparison.csv"
    assert (
        compare_cli.main(
            [str(demo_run / "results/crate.zip"), str(demo_run / "results"), "--table", str(table)]
        )
        == 0
    )

    comparison = pd.read_csv(table)
    assert len(comparison) == 15 and set(comparison["match"]) == {"same run config"}
    assert comparison["throughput_ratio"].eq(1.0).all()
    # one repeat per point: judged on each run's window (no difference), untested where a window was
    # not filled (the profile runs, 5 steps)
    windowed = comparison["verdict_basis"].eq("within-run spread, one repeat")
    assert set(comparison.loc[windowed, "verdict"]) == {"no significant difference"}
    assert set(comparison.loc[~windowed, "stage"]) == {"profile"}
    assert comparison.loc[~windowed, "verdict"].str.startswith("not tested").all()


def test_a_title_change_rewrites_only_the_paper(demo_run):
    config = yaml.safe_load((demo_run / "config/demo.yaml").read_text())
    config["study"]["title"] = "Another title"
    path = demo_run / "config/demo-title.yaml"
    path.write_text(yaml.safe_dump(config))
    plan = dag.job_counts(run_snakemake(demo_run, "--dry-run", "--configfile", str(path)).stdout)
    paper = {"paper_numbers", "paper_draft"} | ({"paper_pdf"} if shutil.which("latexmk") else set())
    # track: the new paper into MLflow; crate: the study's crate, written again with it
    assert set(plan) - {"all"} == paper | {"track", "crate"}


def _plan_with(demo_run: Path, name: str, change) -> dict[str, int]:
    config = yaml.safe_load((demo_run / "config/demo.yaml").read_text())
    change(config)
    path = demo_run / f"config/demo-{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return dag.job_counts(run_snakemake(demo_run, "--dry-run", "--configfile", str(path)).stdout)


TRAINING_RULES = {"baseline_run", "scaling_run", "sensitivity_run", "profile_run"}


def test_a_smoke_test_run_again_re_runs_no_training_job(demo_run):
    plan = _plan_with(demo_run, "smoke", lambda c: c["smoke"].update(loader_batches=11))
    assert "smoke_io" in plan and not TRAINING_RULES & set(plan), plan


def test_a_training_setting_re_runs_every_training_job_even_when_the_smoke_tests_re_run(demo_run):
    """The smoke tests carry the training settings too: they re-run, and must not hide the training
    jobs' own change (an ancient() gate input would: Snakemake skips the jobs below one that re-runs)."""
    plan = _plan_with(demo_run, "lr", lambda c: c["train"].update(lr=0.04))
    assert "smoke_step" in plan
    assert plan.get("scaling_run") == 4 and plan.get("baseline_run") == 1, plan


def changed_sensitivity_config(workdir: Path) -> tuple[Path, float, float]:
    config = yaml.safe_load((workdir / "config/demo.yaml").read_text())
    old, new = config["sensitivity"]["axes"]["bucket_cap_mb"][-1], 50
    config["sensitivity"]["axes"]["bucket_cap_mb"][-1] = new
    path = workdir / "config/demo-changed.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, old, new


def test_changing_one_sensitivity_value_plans_only_the_affected_jobs(demo_run):
    path, _, _ = changed_sensitivity_config(demo_run)
    plan = dag.job_counts(run_snakemake(demo_run, "--dry-run", "--configfile", str(path)).stdout)
    config = yaml.safe_load(path.read_text())
    sweep = config["sensitivity"]["axes"]
    assert plan.get("sensitivity_run") == len(sweep["precision"]) * len(sweep["per_gpu_batch"])
    upstream = {"fetch", "preprocess", "baseline_run", "scaling_run", "profile_run"}
    assert not upstream & set(plan), f"unaffected stages re-planned: {plan}"


def test_asking_for_one_grid_point_runs_only_that_point(demo_run):
    path, _, new = changed_sensitivity_config(demo_run)
    batch = yaml.safe_load(path.read_text())["sensitivity"]["axes"]["per_gpu_batch"][0]
    target = f"results/runs/sensitivity/fp32/bs{batch}_bucket{new}/summary.json"
    # The target goes first: --configfile takes every word after it.
    result = run_snakemake(demo_run, target, "--configfile", str(path))
    assert dag.job_counts(result.stdout + result.stderr) == {"sensitivity_run": 1}
    assert (demo_run / target).stat().st_size > 0


RERUNS_PAGE = "docs/guide/reruns.md"


def one_point_commands() -> list[str]:
    """The partial re-runs guide's commands that ask for one grid point by its path."""
    pattern = r"^(snakemake --profile profiles/local results/runs/\S+/summary\.json)\s*$"
    return re.findall(pattern, (REPO / RERUNS_PAGE).read_text(), re.M)


def test_the_guides_one_point_commands_name_points_of_the_demo(demo_run):
    """The commands are run here, on the finished demo (nothing left to do: each path is one of its
    points); asking for points by path from a fresh copy is tests/test_rerun.py's fixture, and that
    only the point asked for runs is the test above."""
    commands = one_point_commands()
    assert len(commands) >= 2, f"{RERUNS_PAGE} shows no one-point command"
    for command in commands:
        target = command.split()[-1]
        assert (demo_run / target).stat().st_size > 0, command
        result = run_snakemake(demo_run, target)
        assert "Nothing to be done" in result.stdout + result.stderr, command


def test_lint_is_clean(workflow_copy):
    result = run_snakemake(workflow_copy, "--lint", check=False)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("key_path", "bad_value", "expected"),
    [
        (("sensitivity", "precision"), ["fp8"], "'precision' was unexpected"),
        (("scaling", "world_sizes"), [0, 2], "world_sizes"),
        (("train", "epochs"), "many", "epochs"),
    ],
)
def test_schema_violation_fails_before_any_job_naming_the_key(workflow_copy, key_path, bad_value, expected):
    config = yaml.safe_load((workflow_copy / "config/demo.yaml").read_text())
    section, key = key_path
    config[section][key] = bad_value
    bad = workflow_copy / "config/bad.yaml"
    bad.write_text(yaml.safe_dump(config))
    result = run_snakemake(workflow_copy, "--configfile", str(bad), check=False)
    assert result.returncode != 0
    message = result.stdout + result.stderr
    assert expected in message and section in message, message[-3000:]
    assert not (workflow_copy / "results").exists(), "a job ran despite the invalid config"


def test_compare_against_another_study_runs_inside_the_workflow(demo_run, tmp_path):
    """compare.against: the comparison after aggregation, into the report's table and figure, the
    paper's section and the crate. Run last: it leaves the demo's paper and crate with a comparison."""
    import pandas as pd

    other = tmp_path / "site-b"
    other.mkdir()
    shutil.copy2(demo_run / "results/crate.zip", other / "crate.zip")

    def against_site_b(config):
        config["compare"] = {"against": str(other / "crate.zip"), "label": "site B"}

    plan = _plan_with(demo_run, "compare", against_site_b)
    paper = {"paper_numbers", "paper_draft"} | ({"paper_pdf"} if shutil.which("latexmk") else set())
    assert set(plan) - {"all"} == {"compare", "crate", "track"} | paper, plan
    run_snakemake(demo_run, "--configfile", str(demo_run / "config/demo-compare.yaml"))
    comparison = pd.read_csv(demo_run / "results/tables/comparison.csv")
    assert len(comparison) == 15 and comparison["throughput_ratio"].eq(1.0).all()
    assert (demo_run / "results/figures/comparison.png").stat().st_size > 0
    numbers = (demo_run / "results/paper/numbers.tex").read_text()
    assert "\\newcommand{\\ComparedWith}{site B}" in numbers
    assert "\\newcommand{\\ComparisonMatched}{15}" in numbers
    assert "Comparison with another study" in (demo_run / "results/paper/paper.tex").read_text()
    crate = json.loads((demo_run / "results/crate/ro-crate-metadata.json").read_text())
    assert any(entity["@id"] == "#job-compare" for entity in crate["@graph"])


def _gpu_like(runs):
    """The demo's catalog as a one-GPU study would write it: nccl, cuda, width 64, 30x the throughput."""
    import pandas as pd

    from tests.compare_studies import scale_throughput

    runs["config.backend"], runs["config.device"], runs["config.width"] = "nccl", "cuda", 64
    return scale_throughput(runs, pd.Series(True, index=runs.index), 30.0)


def test_a_slowed_copy_of_the_demo_is_judged_on_its_windows_and_named(demo_run, tmp_path):
    """Issue 43: the demo (one repeat) against a copy of its catalog whose 2-process points ran at
    0.8x. A point is called slower exactly where both runs' window spreads resolve 20 % (the interval
    from one sub-interval's spread per side, df 2(k-1)); every such point is named in the headline
    either way; the untouched points are never called slower or faster."""
    import math

    import pandas as pd

    from scalestudy.analysis.stats import t_quantile
    from scalestudy.compare import __main__ as compare_cli
    from scalestudy.compare import points, spread
    from tests.compare_studies import catalog_copy, log_spread, scale_throughput

    results = demo_run / "results"
    runs = pd.read_csv(results / "tables/runs.csv")
    two = runs["world_size"].eq(2)
    slow = catalog_copy(
        results, tmp_path / "demo-slow", lambda r: scale_throughput(r, r["world_size"].eq(2), 0.8)
    )
    out = {name: tmp_path / name for name in ("t.csv", "c.md")}
    argv = [str(results), str(slow), "--table", str(out["t.csv"]), "--markdown", str(out["c.md"])]
    assert compare_cli.main(argv) == 0
    table = pd.read_csv(out["t.csv"])
    table.index = table["stage"] + "/" + table["point"]
    headline = out["c.md"].read_text().split("\nA: ")[0]
    assert headline.startswith("# demo-slow (B) against demo (A)")  # A's name from its crate
    for _, run in runs[two].iterrows():
        row = table.loc[points.point_name(run)]
        assert row["throughput_ratio"] == pytest.approx(0.8) and row["repeats_a"] == row["repeats_b"] == 1
        assert f"{row.name} 0.800" in headline, row.name
        rates = spread.interval_rates(run.get("interval_images_per_s"), run.get("window_filled"))
        if len(rates) < 2:
            assert row["verdict"].startswith(points.NOT_TESTED), row.name
            continue
        half = (
            t_quantile(0.975, 2 * (len(rates) - 1)) * math.sqrt(2) * log_spread(run["interval_images_per_s"])
        )
        assert row["verdict_basis"] == spread.WITHIN
        assert (row["verdict"] == points.SLOWER) == (math.log(0.8) + half < 0), (row.name, half)
    untouched = table.drop(index=[points.point_name(run) for _, run in runs[two].iterrows()])
    assert not untouched["verdict"].isin([points.SLOWER, points.FASTER]).any()
    assert "within-run spread, one repeat" in headline


def test_a_copy_of_the_demo_slower_everywhere_fails_the_gate_and_the_demo_itself_passes(
    demo_run, tmp_path, capsys
):
    """Issue 54: every run of a copy of the demo's catalog at 0.8x (one repeat a point): the
    study-level verdict is slower with its interval below 1 and `--fail-on slower` exits 1 naming it;
    the demo against itself exits 0 with "no difference"; no line that is not the comparison's."""
    import pandas as pd

    from scalestudy.compare import __main__ as compare_cli
    from tests.compare_studies import catalog_copy, scale_throughput

    results = demo_run / "results"
    slow = catalog_copy(
        results, tmp_path / "demo-slow", lambda r: scale_throughput(r, pd.Series(True, index=r.index), 0.8)
    )
    summary = tmp_path / "summary.json"
    assert compare_cli.main([str(results), str(slow), "--fail-on", "slower", "--summary", str(summary)]) == 1
    out, err = capsys.readouterr()
    study = json.loads(summary.read_text())["study"]
    assert study["verdict"] == "slower" and study["ci_high"] < 1.0 and study["ratio"] == pytest.approx(0.8)
    assert out.splitlines()[2].startswith(
        "Study-level verdict: slower: B / A 0.800, 95% interval [0.800, 0.800]"
    )
    assert err.startswith("compare: --fail-on slower: Study-level verdict: slower") and err.count("\n") == 1
    assert compare_cli.main([str(results), str(results), "--fail-on", "slower", "faster"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[2].startswith("Study-level verdict: no difference: B / A 1.000") and not err


def test_a_gpu_study_against_the_demo_is_refused_in_one_line_or_warned_once(demo_run, tmp_path, capsys):
    from scalestudy.compare import __main__ as compare_cli
    from tests.compare_studies import catalog_copy

    results = demo_run / "results"
    gpu = catalog_copy(results, tmp_path / "h100", _gpu_like)
    assert compare_cli.main([str(results), str(gpu)]) == compare_cli.EXIT_NOT_THE_SAME
    captured = capsys.readouterr()
    refusal = [line for line in captured.err.splitlines() if line.startswith("compare:")]
    assert len(refusal) == 1 and not captured.out, captured.err
    for named in ("backend (gloo vs nccl)", "device (cpu vs cuda)", "width (8 vs 64)", "--allow-different"):
        assert named in refusal[0], refusal[0]
    markdown = tmp_path / "c.md"
    assert compare_cli.main([str(results), str(gpu), "--allow-different", "--markdown", str(markdown)]) == 0
    lines = markdown.read_text().splitlines()
    assert lines[0] == "# h100 (B) against demo (A)"
    assert [i for i, line in enumerate(lines) if "not the same experiment" in line] == [2]


def test_the_compare_rule_refuses_another_experiment_unless_allowed(demo_run, tmp_path):
    """Run after the comparison above (it leaves the demo's comparison with the GPU-like copy)."""
    from tests.compare_studies import catalog_copy

    gpu = catalog_copy(demo_run / "results", tmp_path / "h100", _gpu_like)
    config = yaml.safe_load((demo_run / "config/demo.yaml").read_text())
    config["compare"] = {"against": str(gpu), "label": "h100"}
    path = demo_run / "config/demo-h100.yaml"
    path.write_text(yaml.safe_dump(config))
    target = "results/tables/comparison.csv"
    result = run_snakemake(demo_run, target, "--configfile", str(path), check=False)
    assert result.returncode != 0
    said = [line for line in (result.stdout + result.stderr).splitlines() if "compare: refused:" in line]
    assert said and "backend (nccl vs gloo)" in said[0], result.stderr[-3000:]  # A: the other study
    config["compare"]["allow_different"] = True
    path.write_text(yaml.safe_dump(config))
    run_snakemake(demo_run, target, "--configfile", str(path))
    text = (demo_run / "results/compare/comparison.md").read_text().splitlines()
    assert text[2].startswith("WARNING: h100 and demo are not the same experiment")


def _contents(path: Path) -> Iterator[bytes]:
    """A file's bytes, and what a scan of the raw bytes would miss: a zip's members (deflated), a
    gzip file's content, an SQLite database's rows (a text may span its pages)."""
    data = path.read_bytes()
    yield data
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            yield from (archive.read(name) for name in archive.namelist())
    elif data[:2] == b"\x1f\x8b":
        yield gzip.decompress(data)
    elif data.startswith(b"SQLite format 3\x00"):
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as database:
            yield "\n".join(database.iterdump()).encode()


def secrets_found(roots: list[Path], consoles: list[str], canaries: list[str]) -> list[str]:
    """`<where>: <canary>` for every canary in a file under `roots` or in a console output."""
    found = [
        f"console {index}: {canary}"
        for index, text in enumerate(consoles)
        for canary in canaries
        if canary in text
    ]
    for path in sorted(p for root in roots for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
        contents = list(_contents(path))
        found += [
            f"{path}: {canary}" for canary in canaries if any(canary.encode() in data for data in contents)
        ]
    return found


def test_no_secret_reaches_any_file_of_the_study_or_its_console(demo_run):
    """Issue 55, the canary scan. The demo ran with secrets in its environment (ENV_CANARIES); now a
    config holding credentials in URLs, from a file and from --config, with the same environment,
    is refused before planning. Then no canary is in any file under results/ (the crate and its zip,
    the MLflow store, the logs, provenance) or .snakemake/ (metadata, logs), nor on any console.
    Before the refusal, the crate's config.json and config file, its zip, Snakemake's metadata and
    log and the console (the crate job's command line) held the URL's credentials."""
    login = f"https://alice:{URL_CANARY}@mirror.example.org/cifar-10-python.tar.gz"
    signed = f"https://b.s3.example.com/c.tar.gz?X-Amz-Credential=AKIA&X-Amz-Signature={URL_CANARY}"

    def with_credentials(config):
        config["data"]["mirrors"] = [login, signed]

    configfile = write_config(demo_run, "canary.yaml", with_credentials)
    routes = (["--configfile", configfile], ["--config", "data=" + json.dumps({"mirrors": [login]})])
    runs = [
        subprocess.run(
            [sys.executable, "-m", "snakemake", "--profile", "profiles/local", *route],
            cwd=demo_run,
            env={**snakemake_env(), **ENV_CANARIES},
            capture_output=True,
            text=True,
            timeout=1200,
        )
        for route in routes
    ]
    consoles = [(demo_run.parent / CONSOLE).read_text(), *(run.stdout + run.stderr for run in runs)]
    roots = [demo_run / "results", demo_run / ".snakemake"]
    assert not secrets_found(roots, consoles, [URL_CANARY, *ENV_CANARIES.values()])
    for run in runs:
        output = run.stdout + run.stderr
        assert run.returncode == 2 and "invalid config: credentials in data.mirrors[0] (" in output, output[
            -3000:
        ]
    assert len(list((demo_run / "results/runs").rglob("summary.json"))) >= 2  # the scan saw the study
