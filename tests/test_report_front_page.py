"""The report's words (report/*.rst, rendered as `snakemake --report` renders them: Jinja with
Snakemake's trim_blocks and lstrip_blocks and `snakemake.config`, then reStructuredText) say what the
run did: generated synthetic data or fetched and verified it, which executor ran the study (the
substitutions scalestudy.analysis.execution writes from runs.csv, which the pages include), and
Slurm only where Slurm ran it."""

from __future__ import annotations

import re
from html import unescape
from pathlib import Path

import pandas as pd
import pytest

from scalestudy.analysis import execution
from scalestudy.plan import paths
from tests.conftest import REPO

jinja2 = pytest.importorskip("jinja2")
docutils_core = pytest.importorskip("docutils.core")

INCLUDE = f".. include:: {paths.REPORT_TEXT}"
PARAMS = {"unit": "GPU", "sample_unit": "images", "metric": "accuracy", "workload": "resnet18-cifar10"}


def study_folder(folder: Path, job_ids: list[str | None]) -> Path:
    """A study folder whose runs had these Slurm job ids, with the report's substitutions written
    from its runs.csv as rule table_runs writes them."""
    runs = pd.DataFrame({"job_id": job_ids, "hosts": "gpu01", "device": "cuda", "device_name": "NVIDIA H100"})
    system = pd.DataFrame({"host": ["gpu01"], "slurm": ["slurm 23.11.4"]})
    (folder / "results/tables").mkdir(parents=True)
    runs.to_csv(folder / "results/tables/runs.csv", index=False)
    system.to_csv(folder / "results/tables/system.csv", index=False)
    argv = ["--runs", "results/tables/runs.csv", "--system", "results/tables/system.csv"]
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        assert execution.main([*argv, "--out", paths.REPORT_TEXT]) == 0
    return folder


class Result:
    """A file of the report as its pages' Jinja sees it (Snakemake's FileRecord: `target`, its name)."""

    def __init__(self, target: str):
        self.target = target


WITH_CATALOG = [Result("runs.csv"), Result("scaling.csv")]


def page(name: str, config: dict, folder: Path, files: list[Result] = WITH_CATALOG) -> str:
    """A report page's text as the report shows it (markup removed, whitespace joined), rendered in
    the study's folder (the include is relative to it, as in Snakemake's working directory), in a
    report holding `files` (by default the run catalog, as every report of a study that trained)."""

    class Snakemake:
        pass

    Snakemake.config, Snakemake.params = config, type("Params", (), PARAMS)
    environment = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)  # Snakemake's report's
    text = environment.from_string((REPO / "report" / name).read_text())
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        html = docutils_core.publish_parts(
            text.render(snakemake=Snakemake, categories={}, files=files),
            writer="html",
            settings_overrides={"report_level": 2, "halt_level": 2},  # a warning fails the test
        )["html_body"]
    return " ".join(unescape(re.sub(r"<[^>]*>", " ", html)).split())


@pytest.fixture
def local(tmp_path) -> Path:
    return study_folder(tmp_path / "local", [None, None])


@pytest.fixture
def under_slurm(tmp_path) -> Path:
    return study_folder(tmp_path / "slurm", ["4101", "4102"])


def test_the_demo_on_synthetic_data_says_it_fetched_nothing(demo_config, local):
    assert demo_config["data"]["source"] == "synthetic"
    text = page("workflow.rst", demo_config, local)
    assert "generated synthetic data offline" in text and "nothing was fetched" in text
    assert "fetched the data" not in text and "verified" not in text
    assert "in its format). The workflow generated" in text  # not "format).The"


def test_a_study_on_cifar10_says_it_fetched_and_verified_it(demo_config, local):
    demo_config["data"]["source"] = "cifar10"
    text = page("workflow.rst", demo_config, local)
    assert "on CIFAR-10. The workflow fetched the data (source cifar10 ) and verified its checksum" in text
    assert "generated synthetic data" not in text and "on synthetic data in its format" not in text


def pages_with_the_executor() -> list[str]:
    """The report's pages that include the executor's words."""
    return sorted(path.name for path in (REPO / "report").glob("*.rst") if INCLUDE in path.read_text())


def test_the_pages_that_name_slurm_include_the_executors_words():
    named = sorted(path.name for path in (REPO / "report").glob("*.rst") if "Slurm" in path.read_text())
    assert not named, f"report pages that name Slurm whatever ran the study: {named}"
    assert {"workflow.rst", "table_runs.rst"} <= set(pages_with_the_executor())


@pytest.mark.parametrize("name", pages_with_the_executor())
def test_a_local_study_names_no_slurm_and_one_slurm_ran_does(demo_config, local, under_slurm, name):
    local_text, slurm_text = page(name, demo_config, local), page(name, demo_config, under_slurm)
    assert "Slurm" not in local_text and "|" not in local_text, local_text
    assert "Slurm" in slurm_text and "|" not in slurm_text, slurm_text


def test_the_front_page_says_which_executor_ran_the_study(demo_config, local, under_slurm):
    assert (
        "Snakemake's local executor ran every job of this study on one machine (gpu01), each rank on a GPU"
        " (NVIDIA H100); no batch system was involved" in page("workflow.rst", demo_config, local)
    )
    assert (
        "Slurm (version 23.11.4) ran the 2 training runs as 2 Slurm jobs, submitted by Snakemake's Slurm"
        " executor plugin, on gpu01" in page("workflow.rst", demo_config, under_slurm)
    )


def test_a_report_of_targets_before_the_catalog_has_a_front_page_without_the_executors_words(
    demo_config, tmp_path
):
    """A report built for targets before the run catalog (the system table, the smoke tests) has no
    executor's words to include (rule table_runs writes them): its front page says so, and renders."""
    text = page("workflow.rst", demo_config, tmp_path, files=[Result("system.csv")])
    assert "No training run is in this report" in text and "|" not in text, text
