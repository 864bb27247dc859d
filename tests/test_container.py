"""containers/scalestudy.def against envs/requirements.txt, and rules/container.smk (no Apptainer here:
the definition is checked statically, the way Apptainer's parser reads it)."""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from tests.conftest import REPO, copy_workflow, snakemake_env, stub_apptainer
from tests.requirement_files import PIN, pins, requirement_lines

DEFINITION = REPO / "containers/scalestudy.def"


def parse_definition(text: str) -> tuple[dict[str, str], dict[str, str]]:
    """(header, sections) as Apptainer's parser splits them: a section starts at a line whose first
    word begins with '%'; header lines are 'Key: value', '#' lines are comments."""
    header: dict[str, str] = {}
    sections: dict[str, str] = {}
    current = None
    for line in text.splitlines():
        words = line.split()
        if words and words[0].startswith("%"):
            current = words[0][1:].lower()
            sections[current] = ""
        elif current is not None:
            sections[current] += line + "\n"
        elif words and not words[0].startswith("#"):
            key, _, value = line.partition(":")
            header[key.strip().lower()] = value.strip()
    return header, sections


@pytest.fixture(scope="module")
def definition():
    return parse_definition(DEFINITION.read_text())


def labels(sections: dict[str, str]) -> dict[str, str]:
    pairs = (line.strip().split(None, 1) for line in sections["labels"].splitlines() if line.strip())
    return {pair[0]: pair[1] if len(pair) > 1 else "" for pair in pairs}


def test_every_requirement_is_an_exact_pin():
    """The image installs envs/requirements.txt: anything not pinned with == is not reproducible."""
    loose = [line for line in requirement_lines() if not PIN.match(line)]
    assert not loose, f"envs/requirements.txt entries without an exact == pin: {loose}"


def test_the_header_is_a_cuda_runtime_image_matching_torchs_cuda(definition):
    header, _ = definition
    assert header["bootstrap"] == "docker"
    match = re.fullmatch(
        r"nvidia/cuda:(\d+)\.(\d+)\.(\d+)-(?:cudnn-)?runtime-ubuntu(\d+\.\d+)", header["from"]
    )
    assert match, header["from"]
    torch = pytest.importorskip("torch")
    if not torch.version.cuda:
        pytest.skip(f"this environment's torch {torch.__version__} is a CPU build: its CUDA is unknown")
    # The pinned wheel bundles its CUDA: the base image's CUDA should be the same major.minor.
    assert f"{match[1]}.{match[2]}" == torch.version.cuda, f"{header['from']} vs torch {torch.__version__}"


def test_labels_name_the_pinned_versions(definition):
    _, sections = definition
    found = labels(sections)
    wanted = pins()
    for package in ("torch", "torchvision"):
        assert found[f"scalestudy.{package}"] == wanted[package], package
    header, _ = definition
    assert found["scalestudy.cuda"] == header["from"].split(":")[1].split("-")[0]
    assert found["scalestudy.version"] == __import__("scalestudy").__version__
    # The project's Python (pyproject, .venv), installed by name; %test checks what it really got.
    assert found["scalestudy.python"] == "3.11"
    assert "python3.11 -m venv /opt/venv" in sections["post"]
    assert "(3, 11)" in sections["test"]


def test_the_image_installs_exactly_envs_requirements_txt(definition):
    _, sections = definition
    files = [shlex.split(line) for line in sections["files"].splitlines() if line.strip()]
    copied = {source: target for source, target in files}
    target = copied["envs/requirements.txt"]
    assert copied["scalestudy"] == "/opt/scalestudy/scalestudy"
    post = sections["post"]
    assert f"pip install --no-cache-dir -r {target}" in post
    assert "--no-deps /opt/scalestudy" in post
    assert target in sections["test"]
    assert "export PATH=/opt/venv/bin:" in sections["environment"]  # the venv comes first
    assert {"nsys --version", "ncu --version"} <= set(sections["test"].splitlines())


def test_the_test_section_checks_every_pin_and_parses(definition):
    _, sections = definition
    body = sections["test"]
    script = body.split("<<'EOF'\n", 1)[1].split("\nEOF", 1)[0]
    tree = ast.parse(script)
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert {"torch", "torchvision", "scalestudy"} <= imported
    assert "version(name)" in script and "requirements.txt" in script
    # The pin check strips a local version label, as pip's == does: 2.14.1+cu130 satisfies 2.14.1.
    namespace: dict = {}
    exec(compile("def found(v):\n    return v.split('+')[0]\n", "check", "exec"), namespace)
    assert namespace["found"](version("torch")) == pins()["torch"]


def dry_run(workdir: Path, *args: str, dry: bool = True) -> str:
    env = snakemake_env()
    env["PATH"] = f"{stub_apptainer(workdir / '.stub-bin')}{os.pathsep}{env['PATH']}"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
            *(["-n"] if dry else []),
            "--sdm",
            "apptainer",
            "--cores",
            "1",
            *args,
        ],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    return result.stdout + result.stderr


def planned_rules(output: str) -> set[str]:
    return set(re.findall(r"^(?:local)?rule (\w+):", output, re.M))


@pytest.fixture
def workflow(tmp_path) -> Path:
    if not (REPO / "Snakefile").exists():
        pytest.skip("the workflow (Snakefile) is not there yet")
    return copy_workflow(tmp_path / "workflow")


def test_the_image_is_rebuilt_when_the_definition_or_the_pins_change(workflow):
    sif = workflow / "containers/scalestudy.sif"
    assert "build_image" in planned_rules(dry_run(workflow, str(sif.relative_to(workflow))))
    sif.write_bytes(b"image")
    assert "Nothing to be done" in dry_run(workflow, "containers/scalestudy.sif")
    for source in ("containers/scalestudy.def", "envs/requirements.txt"):
        later = sif.stat().st_mtime + 10
        os.utime(workflow / source, (later, later))
        output = dry_run(workflow, "containers/scalestudy.sif")
        assert "build_image" in planned_rules(output) and source in output, source
        os.utime(sif, (later + 10, later + 10))


def test_containerized_jobs_wait_for_the_image_and_a_prebuilt_one_is_never_built(workflow):
    """Under --sdm apptainer every job runs in the image (CPU rules through `container:`, training
    ranks through scalestudy.launch.launcher), so every job lists it as an input: the build comes first."""
    output = dry_run(workflow)
    blocks = re.split(r"\n(?=(?:local)?rule \w+:\n)", output)
    inputs = {
        match[1]: re.search(r"^    input: (.*)$", block, re.M)
        for block in blocks
        if (match := re.match(r"(?:local)?rule (\w+):\n", block))
    }
    assert "build_image" in inputs
    waiting = {rule for rule, line in inputs.items() if line and "containers/scalestudy.sif" in line[1]}
    # table_accounting, paper_pdf, track and crate run on the host, outside the image (sacct, TeX, the
    # MLflow server's client and Snakemake's metadata are the host's): they need not wait.
    host_rules = {"build_image", "all", "table_accounting", "paper_pdf", "track", "crate"}
    missing = sorted(set(inputs) - waiting - host_rules)
    assert not missing, (
        f"jobs that do not list image_input() (would start before the image exists): {missing}"
    )
    with_digest = {rule for rule, line in inputs.items() if line and DIGEST in line[1]}
    assert with_digest == waiting - {"image_digest"}, "every job in the image reads its digest"
    image = workflow.parent / "images" / "scalestudy.sif"
    image.parent.mkdir()
    image.write_bytes(b"a prebuilt image")
    prebuilt = dry_run(workflow, "--config", f"container={{'prebuilt': '{image}'}}")
    assert "build_image" not in planned_rules(prebuilt) and "image_digest" in planned_rules(prebuilt)


DIGEST = "results/image/scalestudy.sif.sha256.json"


def test_the_image_is_hashed_once_by_a_rule_never_when_the_workflow_is_parsed(workflow):
    """The sha256 of a multi-GB image: one job (rule image_digest) per image, read by every job."""
    from scalestudy.launch import container_image as imagedigest

    image = workflow / "containers" / "scalestudy.sif"
    image.write_bytes(b"an image of a few GB" * 1000)
    planned = dry_run(workflow, "--forceall", "--cores", "2")
    assert planned_rules(planned) >= {"build_image", "image_digest", "site_check"}
    assert not list(image.parent.glob("*.sha256.json")), "the parse hashed the image"
    run = dry_run(workflow, DIGEST, "--cores", "1", dry=False)
    assert "image_digest" in planned_rules(run)
    record = json.loads((workflow / DIGEST).read_text())
    assert record["sha256"] == hashlib.sha256(image.read_bytes()).hexdigest()
    assert record["image"] == str(image) and record["size"] == image.stat().st_size
    assert (
        imagedigest.recorded_sha256(str(image), {imagedigest.DIGEST_ENV: str(workflow / DIGEST)})
        == (record["sha256"])
    )
    assert "Nothing to be done" in dry_run(workflow, DIGEST)


def test_the_image_carries_the_compat_libraries_the_site_check_points_to(definition):
    """The site check's remedy for a driver older than 580 names /usr/local/cuda/compat."""
    from scalestudy.preflight import site_rules

    header, sections = definition
    cuda = re.search(r"nvidia/cuda:(\d+)\.(\d+)", header["from"])
    assert f"cuda-compat-{cuda[1]}-{cuda[2]}" in sections["post"].split()
    assert f"ls {site_rules.COMPAT_LIBRARIES}/libcuda.so.*" in sections["test"]


def test_provenance_reads_the_digest_file_of_the_image(tmp_path, monkeypatch):
    """CPU rules get no sha256 from the Snakefile any more: provenance reads rule image_digest's file."""
    from scalestudy import provenance
    from scalestudy.launch import container_image as imagedigest

    image = tmp_path / "image.sif"
    image.write_bytes(b"image bytes")
    digest = tmp_path / "image.sif.sha256.json"
    record = imagedigest.compute(image)
    assert record["sha256"] == hashlib.sha256(b"image bytes").hexdigest() and record["size"] == 11
    digest.write_text(json.dumps(record))
    monkeypatch.delenv(imagedigest.IMAGE_SHA256_ENV, raising=False)
    monkeypatch.setenv(imagedigest.IMAGE_ENV, str(image))
    monkeypatch.setenv(imagedigest.DIGEST_ENV, str(digest))
    assert provenance.collect()["image_sha256"] == record["sha256"]
    image.write_bytes(b"a rebuilt image")  # newer than its digest: never reported as that sha256
    assert provenance.collect()["image_sha256"].startswith(f"stale ({digest} is older than {image}")
    monkeypatch.setenv(imagedigest.DIGEST_ENV, str(tmp_path / "missing.json"))
    assert provenance.collect()["image_sha256"] is None


def compile_script(sections: dict[str, str]) -> str:
    """The Python that %test runs to compile a training step (its second here-document)."""
    return sections["test"].split("<<'COMPILE'\n", 1)[1].split("\nCOMPILE", 1)[0]


def test_the_image_has_the_compiler_and_headers_torch_compile_builds_with(definition):
    """Triton builds its GPU launcher (driver.c, against Python.h) at run time and Inductor's CPU
    path compiles C++: a CUDA runtime image without a compiler fails every compiled job."""
    _, sections = definition
    installed = set(sections["post"].replace("\\\n", " ").split())
    assert {"build-essential", "python3.11-dev"} <= installed
    lines = set(sections["test"].splitlines())
    assert {"cc --version | head -n 1", "test -f /usr/include/python3.11/Python.h"} <= lines
    tree = ast.parse(compile_script(sections))
    called = {ast.unparse(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)}
    assert {"torch.compile", "loss.backward"} <= called


@pytest.mark.slow
def test_the_images_compiled_step_runs_here(definition, tmp_path):
    """%test's compiled step, run on this machine's CPU and compiler (about a minute cold)."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    result = subprocess.run(
        [sys.executable, "-c", compile_script(definition[1])],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "compiler ok" in result.stdout
