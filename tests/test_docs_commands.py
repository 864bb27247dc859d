"""Every shell command README.md and the docs show (PAGES) runs as shown, from a fresh copy of the workflow.

The commands are taken from the pages: fenced ```bash/sh/shell blocks (every line; `\\` continues a
line), ```console blocks (the `$ ` lines), and inline `code` that is a whole command (it starts with
a program and has arguments; a synopsis with placeholders, `<x>`, `...`, `A|B` or CAPITALS, a bare
program or module name, and a lone VAR=value are prose, not commands). Each one runs with bash in a
copy of the checkout's tracked and new files (git ls-files) that links the checkout's .venv, whose
bin/ is first on PATH (as `source scripts/bootstrap.sh` or `source .venv/bin/activate` leave a
shell). A command that exits non-zero fails its test, named by file:line.

What this machine (CPU, no Apptainer, no real site) does not run is in the tables below, each row
with its reason; a row whose command the docs no longer show fails, so the tables stay current.
The Slurm route of docs/guide/cluster.md runs literally in tests/test_slurm.py (tests/slurm_cluster.py's
documented_commands()).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO, snakemake_env
from tests.documented_commands import Command, documented_commands

# --- the one place for commands this test does not run -----------------------------------------
# A row covers the command it names and every command that starts with it and a blank ("nsys": all
# of nsys). Add a row with its reason; a row that matches no documented command fails the tests.
GPU = "needs a GPU (none on this machine)"
SITE = "needs a real Slurm site (its GPUs, allocation, login node or shared file system)"
APPTAINER = "needs Apptainer (not installable here; the slurm profile checks for it even in a dry run)"
STUDY = "needs a finished study with tracking set up (an MLflow server)"
NOT_RUN: dict[str, str] = {
    ".venv/bin/python -m scalestudy.benchmark --device cuda": GPU,
    "python -m scalestudy.benchmark --device cuda": GPU,
    "python -m scalestudy.benchmark.lm --preset gpt2-small --device cuda": GPU,
    "bash scripts/gpu_check.sh": GPU + " (tests/test_gpu.py skips there; the benchmarks need CUDA)",
    # docs/guide/gpu.md: the study on a GPU workstation (its dry run runs; tests/test_gpu_workflow.py
    # runs GPU jobs through Snakemake on a fake NVML)
    "snakemake --profile profiles/local --configfile config/workstation.yaml": GPU,
    "snakemake --profile profiles/local --configfile config/gpu-one.yaml": GPU + " (config/README.md; "
    "scripts/gpu_check.sh's step `study` runs it on a GPU)",
    "GPU_CHECK_STEPS=study bash scripts/gpu_check.sh": GPU + " (the one-GPU study: cuda + nccl)",
    "bash scripts/gpu_bundle.sh": "fetches cp312 wheels from PyPI (tests/test_gpu_bundle.py builds a "
    "bundle for this interpreter without network)",
    "nsys": GPU,
    "apptainer": APPTAINER,
    "snakemake -n --profile profiles/slurm --configfile config/config.yaml": APPTAINER,
    "snakemake --profile profiles/slurm containers/scalestudy.sif": APPTAINER,
    "snakemake --profile profiles/slurm --configfile config/config.yaml": SITE,
    "srun": SITE,
    "salloc": SITE,
    "python -m scalestudy.launch.allocation": SITE + " (inside salloc)",
    "MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false mlflow server": SITE,
    "ssh": SITE + " (a tunnel from your laptop)",
    "$EDITOR config/config.yaml": "opens an editor",
    "python -m scalestudy.preflight.site rank": "prose: the rank program the launcher starts under srun",
}
# Commands that run too long for this module, and the test that runs them: (file, text in it).
COVERED: dict[str, tuple[str, str]] = {
    "bash scripts/demo.sh": ("tests/test_workflow.py", '["bash", "scripts/demo.sh"]'),
    # its config through every stage that trains and what an LM draws in its own units, to their
    # report (LM_TARGETS); demo.sh itself and the workload-blind rest of the chain: the ResNet demo
    "bash scripts/demo.sh --configfile config/demo-gpt.yaml": (
        "tests/test_workloads_workflow.py",
        'LM_CONFIG = "config/demo-gpt.yaml"',
    ),
    "snakemake --report results/report.html": ("scripts/demo.sh", "--report results/report.html"),
    # the re-measuring of contended points (docs/guide/reruns.md): on a fresh copy (no runs.csv) it is
    # the whole demo again; tests/test_rerun.py runs its `targets` and plans its --forcerun on a finished demo
    "snakemake --profile profiles/local --forcerun": ("tests/test_rerun.py", '"--forcerun", *printed'),
    # the whole demo, as demo.sh's first command runs it (tests/test_workflow.py); its point, the
    # rules' python without the venv on PATH, is tests/test_faults.py's
    ".venv/bin/snakemake --profile profiles/local": (
        "scripts/demo.sh",
        'snakemake --profile profiles/local "$@" 2>&1 | python -m scalestudy.console condense\n',
    ),
    # the one-point commands of docs/guide/reruns.md, from a fresh copy: the preflight again and a
    # point (94 s of CI);
    # tests/test_workflow.py runs them on its finished demo, tests/test_rerun.py asks for points by
    # path from a fresh copy
    "snakemake --profile profiles/local results/runs/scaling/weak/w2_r0/summary.json": (
        "tests/test_workflow.py",
        "def test_the_guides_one_point_commands_name_points_of_the_demo",
    ),
    "snakemake --profile profiles/local results/runs/sensitivity/bf16/bs32_bucket25/summary.json": (
        "tests/test_workflow.py",
        "def test_the_guides_one_point_commands_name_points_of_the_demo",
    ),
    "bash scripts/test.sh": (".ci/run", "exec bash scripts/test.sh"),
    ".venv/bin/python -m pytest -m slurm tests/test_slurm.py tests/test_slurm_no_accounting.py -v": (
        "tests/test_slurm_no_accounting.py",
        "pytestmark = pytest.mark.slurm",
    ),
    "bash tests/slurm/cluster.sh up-two-node": (
        "tests/test_slurm_no_accounting.py",
        'cluster_script("up-two-node"',
    ),
    "WITH_DBD=1 bash tests/slurm/cluster.sh up-two-node": ("tests/slurm_cluster.py", '"WITH_DBD": "1"'),
    "bash tests/slurm/cluster.sh status": ("tests/test_slurm.py", 'cluster_script("status")'),
    "bash tests/slurm/cluster.sh exec squeue": ("tests/slurm_cluster.py", 'str(CLUSTER_SH), "exec"]'),
    "bash tests/slurm/cluster.sh down": ("tests/slurm_cluster.py", 'cluster_script("down")'),
    "sbatch --test-only": ("tests/test_slurm_no_accounting.py", "{sbatch} --test-only"),
    "python -m scalestudy.benchmark.slurm_sweep": ("tests/test_slurm_array_faults.py", "slurm_sweep.run("),
    "sbatch profiles/slurm-allocation/driver.sbatch": (
        "tests/test_slurm_scale.py",
        r"^\$ (sbatch .*profiles/slurm-allocation/driver\.sbatch)",
    ),
}


def row(table: dict, text: str) -> str | None:
    """The row of `table` that covers the command `text` (the longest that does), or None."""
    rows = [key for key in table if text == key or text.startswith(key + " ")]
    return max(rows, key=len, default=None)


# The small settings the docs offer (docs/guide/benchmarks.md's options), appended to a module's command.
SMALL: dict[str, str] = {
    "scalestudy.benchmark": "--repeats 1 --steps 2 --batch 16",
    "scalestudy.benchmark dag": "--repeats 1 --configfile config/demo.yaml",
    "scalestudy.benchmark.lm": "--steps 2 --warmup 1 --repeats 1",
}
# Commands that take more than a few seconds: marked slow (CI runs them).
SLOW = re.compile(r"scalestudy\.benchmark|snakemake (--profile profiles/local results/|--lint)")
TIMEOUT_S = 900


def slurm_test_commands() -> set[str]:
    """The docs/guide/cluster.md commands tests/test_slurm.py runs literally (tests/slurm_cluster.py's reading
    of the page)."""
    from tests.slurm_cluster import documented_commands as slurm_documented

    return {" ".join(words) for words in slurm_documented()}


# --- running -------------------------------------------------------------------------------------
def key(text: str) -> str:
    """Commands that differ only by `.venv/bin/` run once (the venv's bin/ is first on PATH)."""
    return re.sub(r"(?<!\S)\.venv/bin/(?=python|snakemake)", "", text)


def with_small_settings(text: str) -> str:
    """The command with the small settings of its module appended (the most specific match)."""
    match = re.search(r"-m (scalestudy[\w.]*)((?: \w+)?)", text)
    if not match:
        return text
    for module in (match.group(1) + match.group(2), match.group(1)):
        if module in SMALL:
            return f"{text} {SMALL[module]}"
    return text


def run_command(text: str, workdir: Path, where: str) -> str | None:
    """Run one command in `workdir`; None if it exits 0, else a message naming file:line."""
    env = {**snakemake_env(), "PATH": f"{workdir / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    command = with_small_settings(text)
    try:
        result = subprocess.run(
            ["bash", "-c", command],
            cwd=workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return f"{where}: `{text}` did not finish in {TIMEOUT_S} s (ran: {command})"
    if result.returncode == 0:
        return None
    tail = (result.stdout[-2000:] + "\n" + result.stderr[-4000:]).strip()
    return f"{where}: `{text}` exited {result.returncode} (ran: {command})\n{tail}"


def fresh_copy(dest: Path) -> Path:
    """The checkout's tracked and new (not ignored) files, as a fresh clone would have them, plus a
    link to its .venv."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    )
    for name in filter(None, listed.stdout.decode().split("\0")):
        source = REPO / name
        if source.is_file():  # a tracked file deleted in the checkout is not copied
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            (dest / name).write_bytes(source.read_bytes())
            (dest / name).chmod(source.stat().st_mode)
    (dest / ".venv").symlink_to(Path(os.environ.get("VIRTUAL_ENV", REPO / ".venv")))
    return dest


ALL = documented_commands()
SLURM_RUN = slurm_test_commands()


def to_run() -> dict[str, list[Command]]:
    """The commands this module runs, once each (by `key`), with every place the docs show them."""
    runs: dict[str, list[Command]] = {}
    for command in ALL:
        if (
            not row(NOT_RUN, command.text)
            and not row(COVERED, command.text)
            and command.text not in SLURM_RUN
        ):
            runs.setdefault(key(command.text), []).append(command)
    return runs


def params():
    for text, places in to_run().items():
        marks = [pytest.mark.slow] if SLOW.search(text) else []
        yield pytest.param(text, places, id=places[0].where, marks=marks)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return fresh_copy(tmp_path_factory.mktemp("docs") / "scalestudy")


@pytest.mark.parametrize(("text", "places"), list(params()))
def test_documented_command_runs(text, places, workdir):
    failure = run_command(places[0].text, workdir, ", ".join(place.where for place in places))
    assert failure is None, failure


# --- the tables stay true ------------------------------------------------------------------------
def test_the_docs_show_commands_and_the_benchmark_is_among_those_run():
    assert len(ALL) >= 20, [c.where for c in ALL]
    assert "python -m scalestudy.benchmark" in to_run()
    assert "python -m scalestudy.benchmark dag" in to_run()


def test_every_row_of_the_tables_is_a_command_the_docs_still_show():
    used = {row(table, command.text) for command in ALL for table in (NOT_RUN, COVERED)}
    stale = sorted((set(NOT_RUN) | set(COVERED)) - used)
    assert not stale, f"rows for commands no page shows any more (remove them): {stale}"


def test_every_covered_command_is_run_by_the_test_named():
    for command, (test_file, text) in COVERED.items():
        assert text in (REPO / test_file).read_text(), f"{test_file} no longer runs `{command}`"


def test_the_slurm_pages_commands_are_run_or_listed():
    """docs/guide/cluster.md's snakemake route runs in tests/test_slurm.py; the rest is run here or listed."""
    slurm_page = [command for command in ALL if command.where.startswith("docs/guide/cluster.md:")]
    assert len(SLURM_RUN) >= 2 and {command.text for command in slurm_page} >= SLURM_RUN
    for command in slurm_page:
        if command.text.startswith("snakemake --profile profiles/slurm-noapptainer"):
            assert command.text in SLURM_RUN, f"{command.where}: `{command.text}` is not run by test_slurm.py"


# --- the extractor and the runner themselves -----------------------------------------------------
BROKEN_PAGE = """\
# A page

```bash
python -c 'print("fine")'   # a comment, then a broken command over two lines:
python -m scalestudy.benchmark \\
    --sections nonsense
```

Run `python -m scalestudy.benchmark --sections nonsense` to see it fail; `python -m scalestudy.train`
and `python -m scalestudy.launch --launch-json JSON -- ARGS...` are names, not commands.

```console
$ python -c 'import sys; sys.exit(3)'
output of the command, not a command
```
"""


def test_a_broken_documented_command_fails_naming_its_file_and_line(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "broken.md").write_text(BROKEN_PAGE)
    commands = documented_commands(tmp_path)
    assert [(c.where, c.text) for c in commands] == [
        ("docs/broken.md:4", "python -c 'print(\"fine\")'"),
        ("docs/broken.md:5", "python -m scalestudy.benchmark --sections nonsense"),
        ("docs/broken.md:9", "python -m scalestudy.benchmark --sections nonsense"),
        ("docs/broken.md:13", "python -c 'import sys; sys.exit(3)'"),
    ]
    failures = [run_command(c.text, REPO, c.where) for c in commands]
    assert failures[0] is None
    assert failures[1].startswith("docs/broken.md:5: `python -m scalestudy.benchmark --sections nonsense`")
    assert "unknown sections" in failures[1]
    assert failures[3].startswith("docs/broken.md:13: `python -c 'import sys; sys.exit(3)'` exited 3")


def test_small_settings_are_appended_to_the_most_specific_module():
    assert with_small_settings(".venv/bin/python -m scalestudy.benchmark dag --profile").endswith(
        "dag --profile --repeats 1 --configfile config/demo.yaml"
    )
    assert with_small_settings("python -m scalestudy.benchmark").endswith("--repeats 1 --steps 2 --batch 16")
    assert with_small_settings("OMP_NUM_THREADS=1 python -m scalestudy.benchmark.lm --steps 20").endswith(
        "--steps 20 --steps 2 --warmup 1 --repeats 1"
    )
    assert with_small_settings("snakemake -n") == "snakemake -n"
