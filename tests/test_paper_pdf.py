"""The paper's PDF: compiled where TeX is installed, or installed by tests/tex/install.sh when the
tests run as root with apt-get (the constructed study's numbers of tests/paper_study.py, the LM's
wording, a broken paper that leaves no PDF); without TeX the workflow plans paper.tex and leaves
paper.pdf out with a note, unless asked for it always."""

# ruff: noqa: F811 - the fixtures imported from tests/paper_study.py are the tests' parameters

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from scalestudy.paper import build, draft, numbers, tables
from tests.conftest import REPO, snakemake_env
from tests.paper_study import (  # noqa: F401 - study_tables, study_numbers: module-scoped fixtures
    BIB,
    CONTEXT,
    TEMPLATE,
    study_numbers,
    study_tables,
    write_numbers,
)


# --------------------------------------------------------------------------- the PDF (needs TeX)
@pytest.fixture(scope="session")
def tex() -> str:
    """latexmk on PATH: present, or installed by tests/tex/install.sh where the tests run as root with apt."""
    if not build.latexmk_available():
        if os.geteuid() != 0 or shutil.which("apt-get") is None:
            pytest.skip(
                "TeX (latexmk) not installed, and installing it needs root and apt-get (tests/tex/install.sh)"
            )
        result = subprocess.run(
            ["sh", str(REPO / "tests" / "tex" / "install.sh")], capture_output=True, text=True, timeout=1200
        )
        if result.returncode != 0 or not build.latexmk_available():
            pytest.skip(f"tests/tex/install.sh could not install TeX: {result.stderr[-500:]}")
    return shutil.which("latexmk")


def paper_folder(folder: Path, tables_: dict, numbers_) -> Path:
    """results/paper/ as the workflow lays it out, with the figures as small vector PDFs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True)
    for name, (filename, render) in tables.TABLES.items():
        (folder / filename).write_text(render(tables_[name]))
    write_numbers(folder, numbers_)
    for name in re.findall(r"\\includegraphics(?:\[[^\]]*\])?\{([^}]*)\}", TEMPLATE.read_text()):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        figure, axes = plt.subplots(figsize=(4, 3))
        axes.plot([1, 2, 4], [1.0, 0.9, 0.8])
        figure.savefig(folder / name)
        plt.close(figure)
    return folder


def test_the_paper_compiles_without_errors_or_undefined_references(
    tex, tmp_path, study_tables, study_numbers
):
    folder = paper_folder(tmp_path / "paper", study_tables, study_numbers)
    args = ["--template", str(TEMPLATE), "--bib", str(BIB), "--numbers", str(folder / "numbers.tex")]
    assert draft.main([*args, "--out", str(folder / "paper.tex")]) == 0
    assert (
        build.main(["--tex", str(folder / "paper.tex"), "--pdf", str(folder / "paper.pdf"), "--latexmk", tex])
        == 0
    )
    assert (folder / "paper.pdf").read_bytes().startswith(b"%PDF")
    assert not list(folder.glob(".latexmk-*"))  # the auxiliary files are gone
    if shutil.which("pdftotext"):
        text = subprocess.run(
            ["pdftotext", str(folder / "paper.pdf"), "-"], capture_output=True, text=True
        ).stdout
        assert "??" not in text  # no unresolved reference or citation
        assert "80.0 %" in text.replace("\u2009", " ") or "80.0%" in text.replace(" ", "")
        assert "Deep residual learning" in text  # the bibliography is there


def test_the_lm_paper_compiles_with_its_own_wording_and_citations(tex, tmp_path, study_tables):
    """A GPT study with DDP and FSDP: its model, unit and citations resolve (no "??")."""
    runs = study_tables["runs"].assign(
        workload="gpt",
        sample_unit="tokens",
        parallelism="ddp",
        final_test_loss=2.0,
        final_test_perplexity=7.4,
    )
    runs.loc[runs["config.mode"] == "weak", "parallelism"] = "fsdp"
    context = {**CONTEXT, "workload": "gpt", "sample_unit": "tokens", "parallelism": ["ddp", "fsdp"]}
    lm_numbers = numbers.build({**study_tables, "runs": runs}, context)
    folder = paper_folder(tmp_path / "paper", study_tables, lm_numbers)
    args = ["--template", str(TEMPLATE), "--bib", str(BIB), "--numbers", str(folder / "numbers.tex")]
    assert draft.main([*args, "--out", str(folder / "paper.tex")]) == 0
    pdf = folder / "paper.pdf"
    assert build.main(["--tex", str(folder / "paper.tex"), "--pdf", str(pdf), "--latexmk", tex]) == 0
    if shutil.which("pdftotext"):
        text = " ".join(
            subprocess.run(["pdftotext", str(pdf), "-"], capture_output=True, text=True).stdout.split()
        )
        assert "??" not in text and "CIFAR" not in text
        assert "GPT-style decoder language model" in text and "tokens/s" in text
        assert "fully sharded data parallel" in text.lower() and "attention is all you need" in text.lower()


def test_a_broken_paper_fails_and_leaves_no_pdf(tex, tmp_path, study_tables, study_numbers):
    folder = paper_folder(tmp_path / "paper", study_tables, study_numbers)
    (folder / "references.bib").write_text(BIB.read_text())
    (folder / "paper.tex").write_text(
        TEMPLATE.read_text().replace(r"\ref{tab:efficiency}", r"\ref{tab:nonexistent}")
    )
    assert (
        build.main(["--tex", str(folder / "paper.tex"), "--pdf", str(folder / "paper.pdf"), "--latexmk", tex])
        == 2
    )
    assert not (folder / "paper.pdf").exists()


# --------------------------------------------------------------------------- the rule's PDF target
def path_without(tools: set[str], folder: Path) -> str:
    """A PATH of symbolic links to every program on PATH except `tools` (TeX "not installed")."""
    folder.mkdir()
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        if not os.path.isdir(directory):
            continue
        for name in os.listdir(directory):
            if name not in tools and not (folder / name).exists():
                (folder / name).symlink_to(Path(directory) / name)
    return str(folder)


def planned_jobs(workdir: Path, *args: str, env_path: str | None = None) -> tuple[dict[str, int], str]:
    env = snakemake_env()
    if env_path is not None:
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env_path}"
    command = [sys.executable, "-m", "snakemake", "--profile", "profiles/local", "--dry-run", *args]
    result = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    output = result.stdout + result.stderr
    jobs = dict(re.findall(r"^(\w+)\s+(\d+)$", output, flags=re.MULTILINE))
    return {name: int(count) for name, count in jobs.items()}, output


def test_without_tex_the_pdf_is_left_out_with_a_note_and_the_tex_is_still_planned(workflow_copy, tmp_path):
    no_tex = path_without({"latexmk", "pdflatex", "bibtex"}, tmp_path / "bin")
    jobs, output = planned_jobs(workflow_copy, env_path=no_tex)
    assert {"paper_numbers", "paper_draft", "paper_tables"} <= set(jobs)
    assert "paper_pdf" not in jobs
    assert "latexmk not found, so results/paper/paper.pdf is skipped" in output
    # paper.pdf: always asks for it all the same (and its job would then say what to install)
    config = yaml.safe_load((workflow_copy / "config" / "demo.yaml").read_text())
    config["paper"] = {"pdf": "always"}
    (workflow_copy / "config" / "always.yaml").write_text(yaml.safe_dump(config))
    jobs, _ = planned_jobs(workflow_copy, "--configfile", "config/always.yaml", env_path=no_tex)
    assert jobs.get("paper_pdf") == 1
