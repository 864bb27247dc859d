"""The report's front page (report/workflow.rst, rendered as `snakemake --report` renders it: Jinja
with `snakemake.config`, then reStructuredText) says what the run did: generated synthetic data or
fetched and verified it, and a Slurm job id only where Slurm ran the job."""

from __future__ import annotations

import re

import pytest

from tests.conftest import REPO

jinja2 = pytest.importorskip("jinja2")
docutils_core = pytest.importorskip("docutils.core")


def front_page(config: dict) -> str:
    """The page's text, as the report shows it (markup removed, whitespace joined)."""

    class Snakemake:
        pass

    Snakemake.config = config
    text = jinja2.Environment().from_string((REPO / "report/workflow.rst").read_text())
    html = docutils_core.publish_parts(
        text.render(snakemake=Snakemake, categories={}, files={}), writer_name="html"
    )["html_body"]
    return " ".join(re.sub(r"<[^>]*>", " ", html).split())


def test_the_demo_on_synthetic_data_says_it_fetched_nothing(demo_config):
    assert demo_config["data"]["source"] == "synthetic"
    page = front_page(demo_config)
    assert "generated synthetic data offline" in page and "nothing was fetched" in page
    assert "fetched the data" not in page and "verified" not in page
    assert "Slurm job id where the Slurm executor ran it" in page  # never promised for a local run


def test_a_study_on_cifar10_says_it_fetched_and_verified_it(demo_config):
    demo_config["data"]["source"] = "cifar10"
    page = front_page(demo_config)
    assert "fetched the data (source cifar10 ) and verified its checksum" in page
    assert "generated synthetic data" not in page and "on synthetic data in its format" not in page
