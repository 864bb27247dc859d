"""A folder that brings Snakemake (and jsonschema) to a Python that lacks them: put it on PYTHONPATH.

    python -m scalestudy.benchmark.bundle --out .gpu-bundle [--wheels-for 3.12] \
        [--present scripts/gpu_device_packages.txt] snakemake jsonschema

The GPU machines this project is lent have torch, pandas and matplotlib but no Snakemake, and
nothing can be installed there (no network). The bundle holds the dependency closure of the
requirements (their `Requires-Dist`, markers evaluated for the target Python), less what the
target already has (`--present`: one distribution name a line), unpacked as in site-packages:

- a pure-Python distribution is copied from this environment's installed files (the venv's pins);
- a compiled one (it installed `.so` files) is copied too when the target is this interpreter, or,
  with `--wheels-for X.Y`, its CPython X.Y manylinux x86_64 wheel of the same version is fetched
  with `pip download` (PyPI) and unzipped: that is the only step that needs the network, and it is
  only taken when preparing the GPU machine (scripts/gpu_bundle.sh);
- files no x86_64 Linux machine runs are left out (PRUNE: pulp's CBC solvers for macOS, Windows,
  32-bit and Arm, 24 MB of the 37).

`bundle.json` in the folder records what it holds (versions, copied or from a wheel), what the
target was taken to have, and the size; a bundle over `--max-mb` is refused (a device call carries
at most 64 MiB with the working tree).
"""

from __future__ import annotations

import argparse
import importlib.metadata as metadata
import json
import platform
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

MANIFEST = "bundle.json"
COMPILED_SUFFIXES = (".so", ".pyd")
# Folders of a distribution that no x86_64 Linux target runs, by distribution.
PRUNE = {
    "pulp": (
        "pulp/solverdir/cbc/osx",
        "pulp/solverdir/cbc/win",
        "pulp/solverdir/cbc/linux/i32",
        "pulp/solverdir/cbc/linux/arm64",
    ),
}
# pip matches a wheel's manylinux tag exactly: every glibc from 2.17 (manylinux2014) to 2.39.
MANYLINUX = [f"manylinux_2_{minor}_x86_64" for minor in range(17, 40)] + [
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
]


class BundleError(RuntimeError):
    """A bundle that cannot be built as asked (names the distribution and why)."""


@dataclass
class Plan:
    """The closure of the requirements: what goes into the bundle and what the target has."""

    bundled: dict[str, metadata.Distribution] = field(default_factory=dict)
    present: set[str] = field(default_factory=set)


def marker_environment(python_version: str) -> dict[str, str]:
    """PEP 508 marker values of a CPython `python_version` (X.Y) on x86_64 Linux."""
    environment = default_environment()
    environment.update(
        python_version=python_version,
        python_full_version=f"{python_version}.0",
        implementation_name="cpython",
        platform_python_implementation="CPython",
        sys_platform="linux",
        platform_system="Linux",
        platform_machine="x86_64",
        os_name="posix",
    )
    return environment


def closure(requirements: list[str], present: set[str], python_version: str) -> Plan:
    """Every distribution the requirements need on the target, installed here, less `present`."""
    environment = {**marker_environment(python_version), "extra": ""}
    plan, todo = Plan(), [Requirement(text) for text in requirements]
    while todo:
        requirement = todo.pop()
        name = canonicalize_name(requirement.name)
        if name in plan.bundled or name in plan.present:
            continue
        if name in present:
            plan.present.add(name)
            continue
        try:
            distribution = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            raise BundleError(
                f"{name} (needed on Python {python_version}) is not installed in this environment "
                f"({sys.prefix}): install it here first"
            ) from None
        plan.bundled[name] = distribution
        for text in distribution.requires or []:
            needed = Requirement(text)
            if needed.marker is None or needed.marker.evaluate(environment):
                todo.append(needed)
    return plan


def installed_files(distribution: metadata.Distribution) -> list[tuple[Path, Path]]:
    """(source, path inside site-packages) of a distribution's files, without byte code and
    without what it installed outside site-packages (console scripts)."""
    root = Path(distribution.locate_file(""))
    files = []
    for entry in distribution.files or []:
        relative = Path(str(entry))
        if relative.parts[0] == ".." or "__pycache__" in relative.parts or relative.suffix == ".pyc":
            continue
        files.append((root / relative, relative))
    return files


def is_compiled(distribution: metadata.Distribution) -> bool:
    return any(str(entry).endswith(COMPILED_SUFFIXES) for entry in distribution.files or [])


def copy_installed(distribution: metadata.Distribution, out: Path) -> None:
    for source, relative in installed_files(distribution):
        if not source.is_file():
            raise BundleError(f"{distribution.metadata['Name']}: installed file {source} is missing")
        (out / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, out / relative)


def download_wheel(name: str, version: str, python_version: str, folder: Path, python: str) -> Path:
    """The CPython `python_version` manylinux x86_64 wheel of name==version, from PyPI, into `folder`
    (new: the one wheel there is that one)."""
    tag = python_version.replace(".", "")
    command = [python, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:"]
    command += ["--python-version", python_version, "--implementation", "cp", "--abi", f"cp{tag}"]
    command += [option for platform_tag in MANYLINUX for option in ("--platform", platform_tag)]
    command += ["--dest", str(folder), f"{name}=={version}"]
    result = subprocess.run(command, capture_output=True, text=True)
    wheels = sorted(folder.glob("*.whl"))
    if result.returncode != 0 or len(wheels) != 1:
        raise BundleError(
            f"no cp{tag} manylinux x86_64 wheel of {name}=={version}: {result.stderr.strip()[-800:]}"
        )
    return wheels[0]


def unpack_wheel(wheel: Path, out: Path) -> None:
    """A wheel unzipped as pip would install it into site-packages (its .data purelib/platlib moved
    to the root, its scripts and headers dropped)."""
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(out)
    for data in out.glob("*.data"):
        for kind in ("purelib", "platlib"):
            if (data / kind).is_dir():
                shutil.copytree(data / kind, out, dirs_exist_ok=True)
        shutil.rmtree(data)


def prune(name: str, out: Path) -> list[str]:
    removed = []
    for folder in PRUNE.get(name, ()):
        if (out / folder).exists():
            shutil.rmtree(out / folder)
            removed.append(folder)
    return removed


def folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def build(
    out: Path,
    requirements: list[str],
    present: set[str],
    wheels_for: str | None = None,
    max_mb: float = 60.0,
    python: str = sys.executable,
) -> dict:
    """Write the bundle into `out` (replaced) and return its manifest (module doc)."""
    python_version = wheels_for or ".".join(platform.python_version_tuple()[:2])
    plan = closure(requirements, {canonicalize_name(name) for name in present}, python_version)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    packages, pruned = {}, []
    try:
        with tempfile.TemporaryDirectory(prefix="wheels-") as wheels:
            for name, distribution in sorted(plan.bundled.items()):
                version = distribution.version
                if wheels_for and is_compiled(distribution):
                    wheel = download_wheel(name, version, wheels_for, Path(wheels) / name, python)
                    unpack_wheel(wheel, staging)
                    packages[name] = {"version": version, "source": wheel.name}
                else:
                    copy_installed(distribution, staging)
                    packages[name] = {"version": version, "source": "copied"}
                pruned += prune(name, staging)
        size = folder_bytes(staging)
        manifest = {
            "requirements": requirements,
            "python": python_version,
            "compiled_from": f"cp{python_version.replace('.', '')} wheels" if wheels_for else sys.prefix,
            "packages": packages,
            "present_on_target": sorted(plan.present),
            "pruned": pruned,
            "bytes": size,
        }
        if size > max_mb * 1e6:
            raise BundleError(f"the bundle holds {size / 1e6:.1f} MB, more than --max-mb {max_mb:g}")
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
        shutil.rmtree(out, ignore_errors=True)
        staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return manifest


def read_names(path: Path | None) -> set[str]:
    """Distribution names, one a line ('#' starts a comment)."""
    if path is None:
        return set()
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return {line for line in lines if line}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m scalestudy.benchmark.bundle", description=__doc__.split("\n")[0]
    )
    parser.add_argument("requirements", nargs="+", help="what the bundle must provide (snakemake ...)")
    parser.add_argument("--out", type=Path, required=True, help="the folder (replaced)")
    parser.add_argument("--present", type=Path, help="distributions the target has, one a line")
    parser.add_argument(
        "--wheels-for",
        metavar="X.Y",
        help="fetch CPython X.Y manylinux x86_64 wheels of the compiled ones (network: PyPI)",
    )
    parser.add_argument("--max-mb", type=float, default=60.0, help="refuse a bigger bundle")
    args = parser.parse_args(argv)
    try:
        manifest = build(args.out, args.requirements, read_names(args.present), args.wheels_for, args.max_mb)
    except BundleError as error:
        print(f"bundle: {error}", file=sys.stderr)
        return 1
    wheels = sorted(name for name, entry in manifest["packages"].items() if entry["source"] != "copied")
    print(
        f"{args.out}: {len(manifest['packages'])} distributions for Python {manifest['python']}, "
        f"{manifest['bytes'] / 1e6:.1f} MB; from wheels: {', '.join(wheels) or 'none'}; "
        f"left to the target: {len(manifest['present_on_target'])}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
