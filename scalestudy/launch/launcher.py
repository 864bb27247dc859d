"""Start the ranks of one training run: one process, torchrun, or srun with the image around each rank.

    python -m scalestudy.launch --launch-json JSON [--rank-prefix-json JSON] -- <trainer arguments>

The launch spec comes from `scalestudy.plan.cluster.launch_spec` (keys in docs/reference/cli.md). The
launcher is chosen by `spec["launcher"]`:

- "srun" (what "auto" picks in a Slurm job's batch step): one task per rank,
  `srun --nodes N --ntasks W --ntasks-per-node T --cpus-per-task C --kill-on-bad-exit=1 ...`; each
  rank finds its rank, local rank and world size in SLURM_PROCID / SLURM_LOCALID / SLURM_NTASKS.
  The CPU count is passed explicitly: the jobstep plugin removes SLURM_CPUS_PER_TASK.
- "local" (what "auto" picks outside Slurm, or inside a step that srun already started): one
  rank as a plain process, more as `torchrun --standalone` on this machine.

With an image, `apptainer exec` wraps every rank (inside srun, on every node), never the launcher;
`rank_prefix` (e.g. `nsys profile ...`) goes inside the container, just before the trainer. The
spec's environment (NCCL settings, thread-pool sizes) and the image's path and sha256 (for
scalestudy.provenance) reach every rank: srun exports the whole environment, and APPTAINERENV_*
copies get them past `--cleanenv` too. Pure standard library; the command is exec'd, never given
to a shell, and logged shell-quoted. Without an image, torchrun's ranks learn the agent's pid (this
process's, kept by exec) and die with it (scalestudy.launch.distributed.die_with_parent).

GPUs (scalestudy.launch.gpus): a launch whose ranks use GPUs (`gpus_per_node` > 0) started here,
outside Slurm, first takes one GPU per rank by a lock per GPU, waiting while they are busy, and
execs with the lock descriptors open, so that the locks last exactly as long as the job's
processes; its ranks see only those GPUs (CUDA_VISIBLE_DEVICES, in NVML's order). Inside a Slurm
allocation Slurm binds the GPUs. More GPUs than the machine offers: exit 2, naming both numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from scalestudy import contract
from scalestudy.launch.container_image import IMAGE_ENV, IMAGE_SHA256_ENV
from scalestudy.plan import schema

TRAINER_MODULE = "scalestudy.train"
TORCHRUN_MODULE = "scalestudy.launch.torchrun"  # torchrun, exiting 75 where the ranks stopped resumably
LAUNCHER_PID_ENV = (
    "SCALESTUDY_LAUNCHER_PID"  # the pid torchrun's agent runs as (scalestudy.launch.distributed)
)
# The launch time (time.time(), once the GPUs are held) every rank inherits: scalestudy.train.startup.
LAUNCH_TIME_ENV = "SCALESTUDY_LAUNCH_TIME"
# What SLURM_STEP_ID holds in a job's batch script or salloc shell: not a step that srun started.
NOT_A_STEP = {"", "batch", "extern", "interactive", "4294967294", "4294967291", "4294967292"}

SPEC_DEFAULTS: dict[str, Any] = {
    "nodes": 1,
    "tasks_per_node": None,
    "cpus_per_task": 1,
    "gpus_per_node": 0,  # GPUs the ranks of one node use, one per rank; 0: CPU ranks
    "gres": None,
    "image": None,
    "apptainer_args": [],
    "binds": [],
    "python": "python",
    "env": {},
}
# The spec's keys that are study settings: the schema's entry says what each accepts and gives the
# default of those SPEC_DEFAULTS leaves out. device: with GPUs, cuda (required) or auto (the CPU
# where the machine has none).
SPEC_SETTINGS = {
    "launcher": ("cluster", "launcher"),
    "device": ("train", "device"),
    "gpus_per_node": ("cluster", "gpus_per_node"),
}


class LaunchError(ValueError):
    """A launch spec that cannot be started; the message names the key and value."""


def check_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The spec with defaults filled in; a LaunchError names any bad key."""
    if not isinstance(spec, Mapping):
        raise LaunchError(f"the launch spec must be a JSON object, got {spec!r}")
    unknown = sorted(set(spec) - set(SPEC_DEFAULTS) - set(SPEC_SETTINGS) - {"world_size"})
    if unknown:
        raise LaunchError(f"unknown launch spec key(s) {unknown}")
    if "world_size" not in spec:
        raise LaunchError("the launch spec has no world_size")
    settings = {key: schema.node(*path) for key, path in SPEC_SETTINGS.items()}
    defaults = {key: entry["default"] for key, entry in settings.items() if key not in SPEC_DEFAULTS}
    full = {**defaults, **SPEC_DEFAULTS, **spec}
    for key in ("world_size", "nodes", "cpus_per_task"):
        _positive_int(full, key)
    for key, entry in settings.items():
        rule = schema.rule_of(entry)
        if not rule.accepts(full[key]):
            raise LaunchError(f"{key} must be {rule.describe()}, got {full[key]!r}")
    if full["tasks_per_node"] is None:
        full["tasks_per_node"] = -(-full["world_size"] // full["nodes"])
    _positive_int(full, "tasks_per_node")
    if full["nodes"] * full["tasks_per_node"] < full["world_size"]:
        raise LaunchError(
            f"world_size={full['world_size']} does not fit on nodes={full['nodes']} x "
            f"tasks_per_node={full['tasks_per_node']}"
        )
    if not isinstance(full["python"], str) or not full["python"]:
        raise LaunchError(f"python must be a non-empty string, got {full['python']!r}")
    for key in ("image", "gres"):
        if full[key] is not None and not (isinstance(full[key], str) and full[key]):
            raise LaunchError(f"{key} must be null or a non-empty string, got {full[key]!r}")
    for key in ("apptainer_args", "binds"):
        if not isinstance(full[key], list) or not all(isinstance(item, str) and item for item in full[key]):
            raise LaunchError(f"{key} must be a list of non-empty strings, got {full[key]!r}")
    if not isinstance(full["env"], Mapping) or not all(
        isinstance(key, str) and key and "=" not in key and isinstance(value, str)
        for key, value in full["env"].items()
    ):
        raise LaunchError(f"env must map variable names to strings, got {full['env']!r}")
    return full


def _positive_int(spec: dict[str, Any], key: str) -> None:
    value = spec[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise LaunchError(f"{key} must be an integer >= 1, got {value!r}")


def resolve_launcher(spec: Mapping[str, Any], environ: Mapping[str, str]) -> str:
    """'srun' or 'local' for a checked spec (check_spec): "auto" is srun in a Slurm allocation's
    batch step, local elsewhere."""
    launcher = spec["launcher"]
    if launcher != "auto":
        return launcher
    in_allocation = bool(environ.get("SLURM_JOB_ID"))
    in_step = environ.get("SLURM_STEP_ID", "") not in NOT_A_STEP
    return "srun" if in_allocation and not in_step else "local"


def build_command(
    spec: Mapping[str, Any],
    train_args: Sequence[str],
    rank_prefix: Sequence[str] = (),
    environ: Mapping[str, str] | None = None,
    workdir: str | None = None,
    module: str = TRAINER_MODULE,
) -> list[str]:
    """The argv that starts every rank of the run (see the module docstring); `module` is what each
    rank runs (`python -m <module>`): the trainer, or another rank program
    (scalestudy.preflight.collectives)."""
    full = check_spec(spec)
    launcher = resolve_launcher(full, os.environ if environ is None else environ)
    workdir = workdir or os.getcwd()
    python = full["python"] if full["image"] else sys.executable
    rank = [*rank_prefix, python, "-m", module, *train_args]
    container = apptainer_args(full, workdir)
    if launcher == "srun":
        return [*srun_args(full), *container, *rank]
    if full["world_size"] == 1:
        return [*container, *rank]
    return [*container, *torchrun_args(full, python, rank_prefix, module), *train_args]


def srun_args(spec: Mapping[str, Any]) -> list[str]:
    """srun with one task per rank; -c explicitly (the rule's shell has no SLURM_CPUS_PER_TASK)."""
    args = [
        "srun",
        f"--nodes={spec['nodes']}",
        f"--ntasks={spec['world_size']}",
        f"--ntasks-per-node={spec['tasks_per_node']}",
        f"--cpus-per-task={spec['cpus_per_task']}",
        "--kill-on-bad-exit=1",
        "--label",
    ]
    if spec["gres"]:
        # Every rank sees all of its node's GPUs and picks SLURM_LOCALID: no per-task binding,
        # which would put the ranks in separate device cgroups and break CUDA IPC / NVLink P2P.
        args.append(f"--gres={spec['gres']}")
    return args


def torchrun_args(
    spec: Mapping[str, Any], python: str, rank_prefix: Sequence[str], module: str = TRAINER_MODULE
) -> list[str]:
    """torchrun on this machine (the same interpreter), exiting 75 where its ranks stopped resumably
    (scalestudy.launch.torchrun)."""
    args = [
        python,
        "-m",
        TORCHRUN_MODULE,
        "--standalone",
        "--nnodes=1",
        f"--nproc-per-node={spec['world_size']}",
    ]
    if rank_prefix:
        # torchrun then runs "<prefix> python -m scalestudy.train ..." as each rank.
        return [*args, "--no-python", *rank_prefix, python, "-m", module]
    return [*args, "-m", module]


def apptainer_args(spec: Mapping[str, Any], workdir: str) -> list[str]:
    """`apptainer exec [args] --bind ... IMAGE`, or nothing without an image."""
    if not spec["image"]:
        return []
    args = ["apptainer", "exec", *spec["apptainer_args"]]
    for bind in [workdir, *spec["binds"]]:
        args += ["--bind", _absolute_bind(bind, workdir)]
    return [*args, os.path.join(workdir, spec["image"])]


def _absolute_bind(bind: str, workdir: str) -> str:
    source, colon, rest = bind.partition(":")
    return os.path.join(workdir, source) + colon + rest


# Rendezvous variables the ranks get from their launcher (torchrun sets them; under srun the trainer
# derives them from SLURM_*). Copies inherited from the submitting shell or a parent process would
# point the ranks at the wrong master (127.0.0.1 on a two-node job), so they are dropped; a value in
# the spec's env (the config's nccl: section) is kept.
INHERITED_RENDEZVOUS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")


def build_env(
    spec: Mapping[str, Any], environ: Mapping[str, str], image_sha256: str | None = None
) -> dict[str, str]:
    """The launcher's environment: the spec's variables, and the image's path and sha256."""
    full = check_spec(spec)
    env = {key: value for key, value in environ.items() if key not in INHERITED_RENDEZVOUS}
    extra = dict(full["env"])
    if full["image"]:
        extra[IMAGE_ENV] = os.path.abspath(full["image"])
        extra[IMAGE_SHA256_ENV] = image_sha256 or "unknown"
    env.update(extra)
    if full["image"]:
        # Also through apptainer's own channel, which survives --cleanenv; with the workflow's
        # SCALESTUDY_* variables (git commit) too.
        passed = {key: value for key, value in env.items() if key.startswith("SCALESTUDY_")}
        env.update({f"APPTAINERENV_{key}": value for key, value in {**passed, **extra}.items()})
    return env


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """Launcher options before `--`, the trainer's arguments after it."""
    argv = list(argv)
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(prog="python -m scalestudy.launch", description=__doc__.split("\n")[0])
    parser.add_argument("--launch-json", required=True, help="the launch spec (cluster.launch_spec)")
    parser.add_argument("--rank-prefix-json", default="[]", help="a JSON list run before each rank")
    parser.add_argument("--dry-run", action="store_true", help="print the command, start nothing")
    parser.add_argument(
        "--module", default=TRAINER_MODULE, help=f"what each rank runs (python -m; default {TRAINER_MODULE})"
    )
    parser.add_argument("--log", help="the rule's log (this process's output): kept per attempt")
    parser.add_argument("--attempt", type=int, default=1, help="Snakemake's attempt (1 = first try)")
    options = parser.parse_args(argv[:split])
    return options, argv[split + 1 :]


def _json(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as error:
        raise LaunchError(f"{what} is not valid JSON: {error}: {text!r}") from error


def prepare(argv: Sequence[str], environ: Mapping[str, str]) -> tuple[list[str], dict[str, str], bool]:
    """(argv, environment, dry run) of a launch, with every check done before anything starts."""
    options, train_args = parse_args(argv)
    spec = check_spec(_json(options.launch_json, "--launch-json"))
    rank_prefix = _json(options.rank_prefix_json, "--rank-prefix-json")
    if not isinstance(rank_prefix, list) or not all(isinstance(item, str) for item in rank_prefix):
        raise LaunchError(f"--rank-prefix-json must be a list of strings, got {rank_prefix!r}")
    sha256 = None
    if spec["image"] and not options.dry_run:
        if not os.path.isfile(spec["image"]):
            raise LaunchError(f"image {spec['image']!r} (container.sif / container.prebuilt) does not exist")
        from scalestudy.launch import container_image as imagedigest

        sha256 = imagedigest.recorded_sha256(spec["image"], environ)
    if not options.dry_run:
        environ = {**environ, **run_record_env(options.attempt, options.log, environ)}
    env = build_env(spec, environ, sha256)
    if not spec["image"] and spec["world_size"] > 1 and resolve_launcher(spec, environ) == "local":
        env[LAUNCHER_PID_ENV] = str(os.getpid())  # torchrun's agent runs as this process (exec)
    command = build_command(spec, train_args, rank_prefix, environ=environ, module=options.module)
    if not options.dry_run and shutil.which(command[0], path=env.get("PATH")) is None:
        raise LaunchError(f"{command[0]!r} is not on PATH (launcher {resolve_launcher(spec, environ)})")
    if resolve_launcher(spec, environ) == "local" and spec["nodes"] > 1:
        print(f"launch: warning: {spec['nodes']} nodes asked for; all ranks run here", file=sys.stderr)
    if not options.dry_run:  # last: a launch that fails its checks waits for no GPU
        take_gpus(spec, environ, env, label=f"{options.log or options.module} in {os.getcwd()}")
        stamp_launch(spec, env)
    return command, env, options.dry_run


def stamp_launch(spec: Mapping[str, Any], env: dict[str, str]) -> None:
    """The launch's time, once its GPUs are held (a wait for one is queueing, not start-up), for the
    ranks' start-up report (scalestudy.train.startup): through apptainer's channel too."""
    stamp = f"{time.time():.6f}"
    env[LAUNCH_TIME_ENV] = stamp
    if spec["image"]:
        env[f"APPTAINERENV_{LAUNCH_TIME_ENV}"] = stamp


def take_gpus(spec: Mapping[str, Any], environ: Mapping[str, str], env: dict[str, str], label: str) -> None:
    """The launch's GPUs (scalestudy.launch.gpus: held by a lock per GPU until the exec'd process
    tree ends, or Slurm's, or none) and their variables in `env`, also past apptainer's --cleanenv."""
    from scalestudy.launch import gpus

    try:
        assigned = gpus.assign(spec, resolve_launcher(spec, environ), environ, label)
    except gpus.GpuError as error:
        raise LaunchError(str(error)) from None
    given = assigned.env()
    env.update(given)
    if spec["image"]:
        env.update({f"APPTAINERENV_{key}": value for key, value in given.items()})


def put_interpreter_first(environ=os.environ, workdir: str = ".") -> str:
    """Put a folder whose `python` is this interpreter first on environ's PATH, and return it: its
    own folder (a venv's bin/), else a wrapper script's under workdir/.snakemake/ (not a link: a
    venv knows itself by its path). The workflow's rules call a bare `python` (rules/common/hooks.smk)."""
    if os.path.basename(sys.executable) == "python":
        folder = os.path.dirname(sys.executable)
    else:
        folder = os.path.abspath(os.path.join(workdir, ".snakemake", "scalestudy-python"))
        os.makedirs(folder, exist_ok=True)
        wrapper = os.path.join(folder, "python")
        with open(wrapper, "w") as handle:
            handle.write(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
        os.chmod(wrapper, 0o755)
    environ["PATH"] = os.pathsep.join([folder, *([environ["PATH"]] if environ.get("PATH") else [])])
    return folder


def run_record_env(attempt: int, log: str | None, environ: Mapping[str, str]) -> dict[str, str]:
    """The attempt and the Slurm job's record for every rank's provenance (the ranks may run where
    scontrol is not); the attempt's log kept beside the rule's log (scalestudy.launch.attempt_logs)."""
    from scalestudy.launch import attempt_logs as attemptlog
    from scalestudy.launch import slurm_job

    if attempt < 1:
        raise LaunchError(f"--attempt must be >= 1, got {attempt}")
    if log:
        kept = attemptlog.keep(log, attempt)
        job = environ.get("SLURM_JOB_ID") or "none (not in Slurm)"
        array_task = (environ.get("SLURM_ARRAY_JOB_ID"), environ.get("SLURM_ARRAY_TASK_ID"))
        if all(array_task):  # how squeue, sacct and scancel name an array task
            job += f" (array task {'_'.join(array_task)})"
        started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        print(f"launch: attempt {attempt}, Slurm job {job}, {started}; also in {kept}", file=sys.stderr)
    return {slurm_job.ATTEMPT_ENV: str(attempt), **slurm_job.slurm_job_env(environ)}


def main(argv: Sequence[str] | None = None) -> int:
    try:
        command, env, dry_run = prepare(sys.argv[1:] if argv is None else argv, os.environ)
    except LaunchError as error:
        print(f"launch: error: {error}", file=sys.stderr)
        return contract.EXIT_BAD_CONFIG
    print(f"launch: {shlex.join(command)}", file=sys.stderr, flush=True)
    if dry_run:
        print(shlex.join(command))
        return 0
    sys.stdout.flush()
    os.execvpe(command[0], command, env)
    return 127  # not reached


if __name__ == "__main__":
    raise SystemExit(main())
