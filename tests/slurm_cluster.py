"""What the Slurm tests share (tests/test_slurm*.py): the throw-away cluster (tests/slurm/cluster.sh)
and its clients, the documented commands of docs/guide/cluster.md run as written, the study's configs for a
cluster, the checks of what Slurm ran and recorded (jobs, run catalog, MLflow runs), and the
fixtures that bring a cluster up (`clusters`, `slurm`, `slurm_accounting`: each module that imports
them brings the cluster it needs up, and down at its end if it was not up before). The demo runs on
a cluster are tests/test_slurm.py's fixtures."""

from __future__ import annotations

import csv
import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from scalestudy.benchmark import slurm_sweep
from scalestudy.plan import cluster, grid, groups, paths, runfiles
from tests.conftest import REPO, copy_workflow, snakemake_env, write_config

CLUSTER_SH = REPO / "tests/slurm/cluster.sh"
DOCS = REPO / "docs/guide/cluster.md"
PROFILE = "profiles/slurm-noapptainer"
LOCK = Path("/tmp/scalestudy-slurm.lock")  # one test session on the cluster at a time
# (a group job's Snakemake id is a uuid, a rule job's a number)
SUBMITTED = re.compile(r"Job \S+ has been submitted with SLURM jobid (\d+) \(log: (\S+)\)\.")
# The documented profile polls every 30 s after 40 s: right for real jobs, slow for 30 short ones.
FAST_POLLING = (
    "--seconds-between-status-checks", "2",
    "--slurm-init-seconds-before-status-checks", "2",
    "--max-status-checks-per-second", "2",
    "--latency-wait", "5",
)  # fmt: skip
ACCOUNT = "studyacct"  # tests/slurm/cluster.sh creates it where there is accounting


class Cluster:
    def __init__(self, nodes: int, accounting: bool) -> None:
        self.nodes = nodes
        self.accounting = accounting
        self.client = ["bash", str(CLUSTER_SH), "exec"]

    def run(self, *command: str, timeout: int = 60, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*self.client, *command], capture_output=True, text=True, timeout=timeout, **kwargs
        )

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` as a dict (finished jobs stay for MinJobAge = 1 hour)."""
        result = self.run("scontrol", "show", "job", "--oneliner", job_id)
        assert result.returncode == 0, result.stderr
        return dict(field.split("=", 1) for field in result.stdout.split() if "=" in field)


def cluster_script(*args: str, accounting: bool = False, timeout: int = 900) -> subprocess.CompletedProcess:
    env = {**snakemake_env(), "WITH_DBD": "1" if accounting else "0"}
    return subprocess.run(
        ["bash", str(CLUSTER_SH), *args], capture_output=True, text=True, timeout=timeout, env=env
    )


class Clusters:
    """Brings up the kind of cluster a test asks for (down first if another kind is up)."""

    def __init__(self) -> None:
        self.was_up = cluster_script("status").returncode == 0
        self.changed = False

    def get(self, accounting: bool) -> Cluster:
        kind = "accounting" if accounting else "no-accounting"
        status = cluster_script("status").stdout.split()
        if status[:1] != ["up"] or status[2:3] != [kind]:
            if status[:1] == ["up"]:
                cluster_script("down")
            self.changed = True
            result = cluster_script("up-two-node", accounting=accounting)
            if result.returncode == 77:  # e.g. no network namespaces in this container: one node
                result = cluster_script("up", accounting=accounting)
            if result.returncode == 77:
                pytest.skip(result.stderr.strip().splitlines()[-1])
            assert result.returncode == 0, f"cluster bring-up failed:\n{result.stderr[-4000:]}"
            status = cluster_script("status").stdout.split()
        assert status[2] == kind, status
        return Cluster(int(status[1]), accounting)


def documented_commands() -> list[list[str]]:
    """The container-less route's snakemake commands, as docs/guide/cluster.md gives them."""
    lines = re.findall(rf"^\$ (snakemake --profile {PROFILE} .*?)\s*(?:#.*)?$", DOCS.read_text(), re.M)
    commands = [shlex.split(line) for line in lines]
    assert len(commands) >= 2, f"docs/guide/cluster.md has no `$ snakemake --profile {PROFILE} ...` commands"
    return commands


def as_documented(command: list[str], configfile: str, *extra: str) -> list[str]:
    """A documented command with the test's config file (and extra options after it)."""
    words = list(command)
    words[words.index("--configfile") + 1] = configfile
    return [sys.executable, "-m", *words, *FAST_POLLING, *extra]


def run_in(slurm: Cluster, workdir: Path, command: list[str], timeout: int) -> subprocess.CompletedProcess:
    """A Snakemake command in the cluster's client namespace; SIGINT on timeout (it cancels its jobs
    then; it ignores SIGTERM while waiting for them)."""
    wrapped = ["timeout", "-s", "INT", "-k", "20", str(timeout), *command]
    return slurm.run(*wrapped, cwd=workdir, env=snakemake_env(), timeout=timeout + 60)


def snakemake(slurm: Cluster, workdir: Path, configfile: str, *args: str, timeout: int = 900):
    """The documented run command, with targets or options added (before --configfile)."""
    run_command = documented_commands()[0]
    head = run_command[: run_command.index("--configfile")]
    command = [sys.executable, "-m", *head, *args, "--configfile", configfile, *FAST_POLLING]
    return run_in(slurm, workdir, command, timeout)


def submitted(output: str) -> dict[str, Path]:
    """Slurm job id -> its Slurm log, from Snakemake's output."""
    return {job_id: Path(log) for job_id, log in SUBMITTED.findall(output)}


def summaries(workdir: Path) -> dict[str, dict]:
    runs = workdir / "results/runs"
    return {
        str(path.parent.relative_to(runs)): json.loads(path.read_text())
        for path in sorted(runs.glob("**/summary.json"))
    }


def shorter_demo(slurm: Cluster, account: str | None = None):
    def change(config: dict) -> None:
        config["scaling"]["modes"] = ["strong"]
        config["sensitivity"]["axes"] = {"precision": ["fp32"], "per_gpu_batch": [16], "bucket_cap_mb": [25]}
        config["profiling"]["world_sizes"] = [2]
        config["train"].update(epochs=2, max_steps_per_epoch=6)  # what runs is tested, not accuracy
        # Two ranks span both nodes: gloo across the network namespaces.
        config["cluster"]["ranks_per_node"] = 1 if slurm.nodes == 2 else 2
        config["cluster"]["account"] = account

    return change


SLURM_STATE = Path(os.environ.get("SCALESTUDY_SLURM_STATE", "/tmp/scalestudy-slurm"))


def controller_submissions() -> int:
    """sbatch calls slurmctld accepted so far (its log, SlurmctldDebug=info)."""
    return slurm_sweep.controller_submissions(SLURM_STATE / "log/slurmctld.log")


def run_documented_demo(slurm: Cluster, workdir: Path, configfile: str, *extra: str) -> str:
    """Every documented command of the container-less route, in order (`extra` options added to
    each); their output."""
    started, outputs = time.monotonic(), []
    for command in documented_commands():
        run = run_in(slurm, workdir, as_documented(command, configfile, *extra), timeout=900)
        output = run.stdout + run.stderr
        assert run.returncode == 0, f"{shlex.join(command)} failed through Slurm:\n{output[-8000:]}"
        outputs.append(output)
    output = "\n".join(outputs)
    print(f"demo through Slurm: {time.monotonic() - started:.0f} s, {len(submitted(output))} Slurm jobs")
    return output


# The demo without accounting sends its runs to a real `mlflow server` on the submit host: 127.0.0.1
# of the cluster's head network namespace, where Snakemake, its follower and rule track run; the
# compute nodes never reach it (docs/guide/tracking.md). No other server listens there.
MLFLOW_PORT = 5055
# The store each study folder's MLflow runs are read from (a server's backing SQLite file).
READ_STORES: dict[Path, str] = {}


def check_jobs(slurm: Cluster, workdir: Path, output: str, configfile: str) -> dict[str, Path]:
    """Every rule not kept on the submit host ran as a COMPLETED Slurm job, with its log."""
    config = yaml.safe_load((workdir / configfile).read_text())
    jobs = submitted(output)
    as_jobs = {log.relative_to(workdir / ".snakemake/slurm_logs").parts[0] for log in jobs.values()}
    planned = set(re.findall(r"^\s*(?:local)?rule (\w+):", output, re.M)) - {"all"}  # group members indented
    local = {rule for rule in planned if cluster.on_submit_host(config, rule)}
    assert local and {"fetch"} <= local, local  # cluster.submit_host_rules
    # a group job's log folder: group_<group>_<its rules>
    grouped = {group for group in groups.GROUPS if re.search(rf"Group job {group} ", output)}
    members = {rule for group in grouped for rule in groups.GROUPS[group]}
    assert {name for name in as_jobs if name.startswith("group_")} == {
        name for name in as_jobs for group in grouped if name.startswith(f"group_{group}_")
    }, as_jobs
    assert len(planned - local) > 10 and {name for name in as_jobs if not name.startswith("group_")} == {
        f"rule_{rule}" for rule in planned - local - members
    }
    for rule in local:
        assert re.search(rf"^localrule {rule}:", output, re.M), rule
    for job_id, log in jobs.items():
        assert log.is_file(), f"Slurm log of job {job_id} missing: {log}"
        state = slurm.job(job_id)
        assert state["JobState"] == "COMPLETED", (job_id, state.get("JobState"), log.read_text()[-2000:])
        assert state["Comment"].startswith("rule_"), state["Comment"]
    return jobs


def catalog(workdir: Path) -> pd.DataFrame:
    return pd.read_csv(workdir / "results/tables/runs.csv", dtype=str).set_index(["stage", "point"])


def check_run_records(slurm: Cluster, workdir: Path, output: str, account: str | None) -> None:
    """Every run's provenance and catalog row name the Slurm job that made it."""
    jobs = submitted(output)
    runs = summaries(workdir)
    expected = {"baseline/default", "scaling/strong/w1_r0", "scaling/strong/w2_r0", "profile/w2"}
    assert expected <= set(runs), sorted(runs)
    rows = catalog(workdir)
    for point, run in runs.items():
        recorded = run["provenance"]["slurm"]
        job_id = recorded["job_id"]
        assert job_id in jobs, f"{point}: job {job_id} is not one Snakemake submitted"
        rule = f"rule_{point.split('/')[0]}_run"
        assert jobs[job_id].relative_to(workdir / ".snakemake/slurm_logs").parts[0] == rule
        state = slurm.job(job_id)
        assert state["NumTasks"] == str(run["results"]["world_size"])
        # the job's own name (the plugin's run uuid), node count and account: not the step's "python"
        assert recorded["job_name"] == state["JobName"] != "python", recorded
        assert recorded["job_num_nodes"] == state["NumNodes"] == str(run["run"]["nodes"]), recorded
        assert recorded["job_account"] == account, recorded
        assert run["provenance"]["attempt"] == 1
        row = rows.loc[(run["run"]["stage"], run["run"]["point"])]
        assert row["provenance.slurm.job_name"] == state["JobName"] and row["attempts"] == "1", row
    manifest = json.loads((workdir / "results/data/packed/manifest.json").read_text())
    assert manifest["provenance"]["slurm"]["job_id"] in jobs  # preprocess: a CPU job


# The system description and the collective benchmark of the demo: with one rank per node, the
# grid's two-rank jobs span both nodes, so `system` describes both hosts (one srun task per node)
# and `comm_bench` measures inter-node collectives (gloo across the nodes' network namespaces).


def rows(path):
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def mlflow_store(workdir: Path, configfile: str):
    """The study's MLflow store (tracking is on by default): its client and experiment id. The
    embedded one, or a server's, read from the server's SQLite file (READ_STORES): this process
    cannot reach the submit host's 127.0.0.1."""
    pytest.importorskip("mlflow")
    from scalestudy import tracking
    from scalestudy.tracking import store

    settings = tracking.settings(yaml.safe_load((workdir / configfile).read_text()), workdir)
    assert settings is not None, "tracking is off"
    read = READ_STORES.get(workdir, settings["uri"])
    assert read.startswith("sqlite:"), settings
    client = store.client({**settings, "uri": read})
    experiment = client.get_experiment_by_name(settings["experiment"])
    assert experiment is not None, f"no MLflow experiment {settings['experiment']} in {read}"
    return client, experiment.experiment_id


def mlflow_run(client, experiment: str, point: str, summary: dict):
    """The one MLflow run of a point's run config (found by the point and config-hash tags)."""
    from scalestudy.tracking import store

    runs = store.find_runs(client, experiment, point, summary["provenance"]["config_hash"])
    assert len(runs) == 1, f"{point}: {len(runs)} MLflow runs of its run config"
    return runs[0]


def store_runs(client, experiment: str, point: str) -> list:
    """Every MLflow run of a point, of any run config."""
    from scalestudy.tracking import store

    return store.find_runs(client, experiment, point)


def status_history(run) -> list[str]:
    from scalestudy.tracking import TAG_HISTORY

    return run.data.tags.get(TAG_HISTORY, "").split(",")


def artifacts(slurm: Cluster, workdir: Path, run_id: str) -> list[str]:
    """A run's top-level artifacts, as the server lists them (its proxied artifact store)."""
    code = (
        "import sys; from mlflow import MlflowClient; "
        "print('\\n'.join(i.path for i in MlflowClient(sys.argv[1]).list_artifacts(sys.argv[2])))"
    )
    uri = f"http://127.0.0.1:{MLFLOW_PORT}"
    listed = slurm.run(sys.executable, "-c", code, uri, run_id, cwd=workdir, timeout=120)
    assert listed.returncode == 0, listed.stderr[-3000:]
    return listed.stdout.split()


# The results tables' columns that say what was learned (not how fast): loss, accuracy, steps, ranks.
LEARNING = re.compile(
    r"(^|\.)(world_size|epochs|steps|final_train_loss|final_test_loss|final_test_acc|best_test_acc)$"
)


# What the local executor takes from the Slurm run: the data and the checks that gate training (the
# gate passed stays passed: rules/gate.smk), so that it runs the training points and the catalog only.
CHECKS_DONE = (paths.RAW_DATA_DIR, paths.SITE_DIR, paths.SMOKE_DIR, paths.GATES_DIR)


def local_catalog(workdir: Path, configfile: str, scratch: Path) -> pd.DataFrame:
    """results/tables/runs.csv of the local executor on workdir's config (its training points and
    the catalog only, on workdir's data and checks: CHECKS_DONE), run once per config and
    session: kept in the session's `scratch` folder (the Slurm routes of two test modules compare to
    it, and pytest may import this module once for each of them)."""
    config = yaml.safe_load((workdir / configfile).read_text())
    config["cluster"].pop("account", None)  # which Slurm account paid is no setting of the local run
    config.pop("tracking", None)  # nor where the runs were tracked (a server the local run cannot reach)
    text = yaml.safe_dump(config, sort_keys=False)
    key = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]
    kept = scratch / "local-catalogs" / f"{key}.csv"
    if not kept.is_file():
        local = copy_workflow(scratch / f"local-{key}" / "scalestudy")
        for done in CHECKS_DONE:  # what is compared is the training: it starts past the gate
            if (workdir / done).is_dir():
                shutil.copytree(workdir / done, local / done)
        (local / configfile).write_text(text)
        started = time.monotonic()
        target = "results/tables/runs.csv"  # before --configfile, which takes several values
        command = [sys.executable, "-m", "snakemake", "--profile", "profiles/local", target]
        run = subprocess.run(
            [*command, "--configfile", configfile], cwd=local, env=snakemake_env(),
            capture_output=True, text=True, timeout=1200,
        )  # fmt: skip
        assert run.returncode == 0, (run.stdout + run.stderr)[-6000:]
        print(f"the local executor's catalog of the same config: {time.monotonic() - started:.0f} s")
        kept.parent.mkdir(exist_ok=True)
        shutil.copy(local / target, kept)
    return pd.read_csv(kept)


def assert_learns_what_the_local_executor_learns(workdir: Path, configfile: str, scratch: Path) -> None:
    """The catalog's learning columns (LEARNING) equal the local executor's on the same config."""
    ours = pd.read_csv(workdir / "results/tables/runs.csv")
    local = local_catalog(workdir, configfile, scratch)
    tables = [table.set_index(["stage", "point"]) for table in (ours, local)]
    columns = [column for column in tables[0].columns if LEARNING.search(column)]
    assert len(columns) >= 5, columns
    cluster_run, local_run = (table[columns].sort_index() for table in tables)
    assert list(cluster_run.index) == list(local_run.index) and len(cluster_run) >= 5, cluster_run.index
    pd.testing.assert_frame_equal(cluster_run, local_run, check_exact=False, rtol=1e-5)


def bad_config(workdir: Path, slurm: Cluster, name: str, **cluster) -> str:
    """The accounting demo's config with `cluster` settings changed (and the point it would run first
    changed too), as a new config file of workdir."""

    def change(config: dict) -> None:
        shorter_demo(slurm, account=ACCOUNT)(config)
        config["cluster"].update(cluster)
        config["smoke"]["train_steps"] += 1  # the preflight group runs again: the first job submitted

    return write_config(workdir, name, change)


@pytest.fixture(scope="module")
def clusters():
    with LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        manager = Clusters()
        yield manager
        if manager.changed and not manager.was_up:
            cluster_script("down")


@pytest.fixture
def slurm(clusters):
    """The two-node cluster without accounting (one node where namespaces are unavailable)."""
    return clusters.get(accounting=False)


@pytest.fixture
def slurm_accounting(clusters):
    return clusters.get(accounting=True)


def sweep_targets(workdir: Path, configfile: str) -> list[str]:
    config = yaml.safe_load((workdir / configfile).read_text())
    return [
        f"results/runs/sensitivity/{point.name}/{runfiles.SUMMARY}"
        for point in grid.sensitivity_points(config)
    ]


def profile_command(configfile: str, *args: str) -> list[str]:
    """profiles/slurm-noapptainer as it is (its polling too); targets before --configfile."""
    profile = ["--profile", "profiles/slurm-noapptainer"]
    return [sys.executable, "-m", "snakemake", *profile, *args, "--configfile", configfile]
