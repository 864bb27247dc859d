"""The study on a real (throw-away) Slurm cluster: tests/slurm/cluster.sh brings up slurmctld and two
slurmd nodes, n1 and n2, each in its own network namespace, on this machine (Debian slurm-wlm + munge;
root and apt-get needed, else these tests are skipped with the reason). Two kinds of cluster, one
after the other: without accounting (sacct answers "accounting storage is disabled") and with it
(mariadb + slurmdbd, WITH_DBD=1).

- the container-less route of docs/slurm.md, its commands taken from the page and run as written
  (only the config file is the test's, and status polling is made faster), finishes the demo study
  (a smaller grid) to the report on both kinds of cluster; two-rank points span both nodes;
- the run catalog names the Slurm job (name, nodes, account, attempts);
- re-runs through Slurm: a changed value carried by existing points re-runs exactly those points;
  a deleted summary.json is measured afresh;
- (training jobs and array tasks stopped at their time limits: tests/test_slurm_array_faults.py)
- the demo without accounting is tracked by a real `mlflow server` on the submit host: every
  point's run names its Slurm job and node list, and the UI (headless Chromium) lists every point;
- its `system` describes both nodes and its collective benchmark spans them;
- the real study's GPU requests (2 nodes x 4 GPUs for world 8) are accepted by Slurm (sbatch
  --test-only against nodes with 4 fake GPUs each).

About 20 minutes on 2 cores. A cluster that was up before is left up; one brought up here is
brought down.
"""

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
from scalestudy.plan import arrays, cluster, groups, slurm_requests
from tests import mlflow_server
from tests.conftest import REPO, copy_workflow, snakemake_env
from tests.mlflow_server import start_server, stop_server

pytestmark = pytest.mark.slurm

CLUSTER_SH = REPO / "tests/slurm/cluster.sh"
DOCS = REPO / "docs/slurm.md"
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


def write_config(workdir: Path, name: str, change, base: str = "config/demo.yaml") -> str:
    """`base` (the demo), changed by `change(config)`, as a config file of the workflow copy."""
    config = yaml.safe_load((REPO / base).read_text())
    change(config)
    path = workdir / "config" / name
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return str(path.relative_to(workdir))


def documented_commands() -> list[list[str]]:
    """The container-less route's snakemake commands, as docs/slurm.md gives them."""
    lines = re.findall(rf"^\$ (snakemake --profile {PROFILE} .*?)\s*(?:#.*)?$", DOCS.read_text(), re.M)
    commands = [shlex.split(line) for line in lines]
    assert len(commands) >= 2, f"docs/slurm.md has no `$ snakemake --profile {PROFILE} ...` commands"
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


# The demo's sbatch calls, counted in slurmctld's log by the two demo fixtures: "separate" (every
# job on its own, the way before issue 22) and "grouped" (the profiles' groups, with job arrays).
SBATCH_CALLS: dict[str, int] = {}


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
# compute nodes never reach it (docs/tracking.md). No other server listens there.
MLFLOW_PORT = 5055
# The store each study folder's MLflow runs are read from (a server's backing SQLite file).
READ_STORES: dict[Path, str] = {}


@pytest.fixture(scope="module")
def demo(clusters, tmp_path_factory):
    """The demo study (a smaller grid) through the documented commands, without accounting, every
    job on its own (`--resources grouped=0`: the short jobs not grouped, as before issue 22),
    tracked by a real MLflow server (tracking.uri) on the submit host."""
    slurm = clusters.get(accounting=False)
    root = tmp_path_factory.mktemp("slurm-demo")
    workdir = copy_workflow(root / "scalestudy")
    (root / "mlflow-server").mkdir()
    server = start_server(root / "mlflow-server", MLFLOW_PORT, via=slurm.client)

    def change(config: dict) -> None:
        shorter_demo(slurm)(config)
        config["tracking"] = {"uri": f"http://127.0.0.1:{MLFLOW_PORT}"}

    configfile = write_config(workdir, "slurm-demo.yaml", change)
    READ_STORES[workdir] = f"sqlite:///{root / 'mlflow-server/mlflow.db'}"
    before = controller_submissions()
    try:
        output = run_documented_demo(slurm, workdir, configfile, "--resources", f"{groups.SLOT}=0")
        SBATCH_CALLS["separate"] = controller_submissions() - before
        yield workdir, configfile, output
    finally:
        stop_server(server)


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


# ----------------------------------------------------------------------------- without accounting


def test_the_documented_commands_finish_the_demo_on_a_cluster_without_accounting(demo, slurm):
    workdir, configfile, output = demo
    assert "accounting storage is disabled" in (slurm.run("sacct").stdout + slurm.run("sacct").stderr)
    assert (workdir / "results/report.html").stat().st_size > 100_000
    check_jobs(slurm, workdir, output, configfile)
    sacct = json.loads((workdir / "results/tables/sacct.json").read_text())
    assert sacct["jobs"] == {} and "disabled" in sacct["note"], sacct


def test_every_run_records_the_slurm_job_that_made_it(demo, slurm):
    workdir, _, output = demo
    check_run_records(slurm, workdir, output, account=None)


def test_a_two_rank_point_spans_both_nodes_with_one_result(demo, slurm):
    if slurm.nodes < 2:
        pytest.skip("network namespaces are unavailable here: the cluster has one node")
    workdir, _, _ = demo
    run = summaries(workdir)["scaling/strong/w2_r0"]
    assert run["provenance"]["hosts"] == ["n1", "n2"] and run["run"]["nodes"] == 2
    assert run["results"]["world_size"] == 2 and run["results"]["backend"] == "gloo"
    assert slurm.job(run["provenance"]["slurm"]["job_id"])["NodeList"] == "n[1-2]"
    assert sorted(p.name for p in (workdir / "results/runs/scaling/strong/w2_r0").glob("summary*")) == [
        "summary.json"
    ]
    log = (workdir / "results/logs/scaling/strong/w2_r0.log").read_text()
    assert "but the ranks run on" not in log, log[-3000:]  # the run config's nodes are the layout's


# The system description and the collective benchmark of the demo: with one rank per node, the
# grid's two-rank jobs span both nodes, so `system` describes both hosts (one srun task per node)
# and `comm_bench` measures inter-node collectives (gloo across the nodes' network namespaces).


def rows(path):
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def test_system_and_comm_bench_ran_as_slurm_jobs(demo, slurm):
    """Each in a Slurm job of the grid's largest shape (both nodes): its own (`rule_system`,
    `rule_comm_bench`) or, as the profiles group the short jobs, the preflight group's one job."""
    workdir, _, output = demo
    folders = {
        job: log.relative_to(workdir / ".snakemake/slurm_logs").parts[0]
        for job, log in submitted(output).items()
    }
    made_by = {
        "system": {  # one record per host (n1.json, ...), beside the nodes_<kind>.json list
            json.loads(path.read_text())["slurm"]["job_id"]
            for path in (workdir / "results/system").glob("n[0-9]*.json")
        },
        "comm_bench": {row["provenance.slurm.job_id"] for row in rows(workdir / "results/comm/busbw.csv")},
    }
    for rule, jobs in made_by.items():
        assert len(jobs) == 1 and jobs <= set(folders), (rule, jobs, folders)  # a job Snakemake submitted
        (job_id,) = jobs
        folder = folders[job_id]  # (the table_* rules run on the submit host)
        assert folder == f"rule_{rule}" or folder.startswith(f"group_{groups.PREFLIGHT}"), folder
        state = slurm.job(job_id)
        assert state["JobState"] == "COMPLETED", state
        assert state["NumNodes"] == str(slurm.nodes)


def test_the_system_table_lists_every_host(demo, slurm):
    workdir, _, _ = demo
    table = rows(workdir / "results/tables/system.csv")
    expected = ["n1", "n2"][: slurm.nodes]
    assert sorted(row["host"] for row in table) == expected
    for row in table:
        assert row["kind"] == "compute" and row["gpu_model"] == "none"  # CPU nodes: said, not guessed
        assert row["slurm"].startswith("slurm") and int(row["logical_cpus"]) >= 1
        assert (workdir / "results/system" / f"{row['host']}.json").is_file()


def test_comm_bench_spans_the_nodes(demo, slurm):
    workdir, _, _ = demo
    bench = rows(workdir / "results/comm/busbw.csv")
    assert {row["collective"] for row in bench} == {"all_reduce", "all_gather", "reduce_scatter"}
    placement = "inter-node" if slurm.nodes == 2 else "intra-node"
    for row in bench:
        assert row["world_size"] == "2" and row["backend"] == "gloo" and row["placement"] == placement
        assert row["hosts"] == " ".join(["n1", "n2"][: slurm.nodes])
        assert float(row["time_s"]) > 0 and row["provenance.slurm.job_id"]
    fit = rows(workdir / "results/tables/comm_bench_fit.csv")
    assert {row["placement"] for row in fit} == {placement}
    for row in fit:  # a loaded host can time a larger message no slower: no slope, no bandwidth
        if float(row["beta_s_per_byte"]) > 0:
            assert float(row["bandwidth_gb_s"]) > 0, row
        else:
            assert row["bandwidth_gb_s"] == "", row


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


def test_every_points_mlflow_run_names_its_slurm_job_and_nodes(demo, slurm):
    """The demo's MLflow server: each training point's run went RUNNING when its job started on a
    compute node (its journal's start record, sent by the study's follower on the submit host) and
    FINISHED, and its tags name the Slurm job and node list that summary.json's provenance and
    Slurm itself name; rule track gave it its files and the study's run the tables and figures."""
    workdir, configfile, output = demo
    client, experiment = mlflow_store(workdir, configfile)
    runs = summaries(workdir)
    assert len(runs) >= 4, sorted(runs)
    for point, summary in runs.items():
        run = mlflow_run(client, experiment, point, summary)
        tags, recorded = run.data.tags, summary["provenance"]
        assert run.info.status == "FINISHED", (point, run.info.status)
        history = status_history(run)
        assert history[-1] == "FINISHED" and "RUNNING" in history, (point, history)
        job_id = recorded["slurm"]["job_id"]
        assert tags.get("slurm.job_ids") == job_id == recorded["slurm_job_id"], (point, tags, job_id)
        assert job_id in submitted(output), f"{point}: job {job_id} is not one Snakemake submitted"
        nodelist = slurm.job(job_id)["NodeList"]
        assert tags.get("slurm.nodelists") == nodelist == recorded["slurm"]["job_nodelist"], (point, tags)
        assert tags.get("hosts") == ",".join(recorded["hosts"]), (point, tags)
        assert tags.get("attempt") == "1" and tags.get("world_size") == str(summary["run"]["world_size"])
        assert {"summary.json", "metrics.csv", "logs"} <= set(artifacts(slurm, workdir, run.info.run_id)), (
            point
        )
    two_nodes = runs["scaling/strong/w2_r0"]
    if slurm.nodes == 2:
        run = mlflow_run(client, experiment, "scaling/strong/w2_r0", two_nodes)
        assert run.data.tags["slurm.nodelists"] == "n[1-2]" and run.data.tags["hosts"] == "n1,n2"
    (study,) = store_runs(client, experiment, "study")
    assert {"tables", "figures"} <= set(artifacts(slurm, workdir, study.info.run_id))


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


@pytest.fixture(scope="module")
def chromium():
    return mlflow_server.chromium_binary()


def test_the_mlflow_ui_lists_every_point_of_the_demo_and_draws_a_metric_chart(
    demo, slurm, chromium, tmp_path
):
    """The server's UI, in headless Chromium on the submit host (as a user opens it through an SSH
    tunnel): the experiment page lists every training point of the demo, and a point's metric chart
    renders. SCALESTUDY_SCREENSHOT_DIR=docs/figures keeps the screenshot (the README's)."""
    workdir, configfile, _ = demo
    client, experiment = mlflow_store(workdir, configfile)
    runs = summaries(workdir)
    points = sorted(runs)
    run = mlflow_run(client, experiment, "scaling/strong/w2_r0", runs["scaling/strong/w2_r0"])
    everything = client.search_runs([experiment], max_results=1000)
    (study,) = [found for found in everything if found.data.tags.get("stage") == "study"]
    stages = {  # the stages' runs, nested under the study's run
        found.info.run_id: found.data.tags.get("stage")
        for found in everything
        if found.data.tags.get("mlflow.parentRunId") == study.info.run_id
    }
    nested = {
        found.data.tags.get("scalestudy.point")
        for found in everything
        if stages.get(found.data.tags.get("mlflow.parentRunId")) == found.data.tags.get("stage")
    }
    assert set(points) <= nested, sorted(set(points) - nested)  # every point under its stage's run
    mlflow_server.check_ui(
        chromium, MLFLOW_PORT, experiment, study.data.tags["mlflow.runName"], len(everything),
        run.info.run_id, tmp_path, via=slurm.client,
    )  # fmt: skip


def test_an_lm_point_trains_with_fsdp2_across_both_nodes(slurm, tmp_path):
    """One point of the LM demo (config/demo-gpt.yaml): FSDP2 over gloo, a rank on each node, its
    sharded checkpoints written by both, and only what that point needs (data, gates) run first."""
    if slurm.nodes < 2:
        pytest.skip("network namespaces are unavailable here: the cluster has one node")
    workdir = copy_workflow(tmp_path / "scalestudy")

    def change(config: dict) -> None:
        config["scaling"].update(modes=["strong"], parallelism=["fsdp"])
        config["train"].update(epochs=3, max_steps_per_epoch=6, checkpoint_every_steps=4)  # 18 >= 3 + 12
        config["cluster"]["ranks_per_node"] = 1

    configfile = write_config(workdir, "slurm-lm.yaml", change, base="config/demo-gpt.yaml")
    point = "scaling/strong/fsdp-w2_r0"
    run = snakemake(slurm, workdir, configfile, f"results/runs/{point}/summary.json")
    assert run.returncode == 0, (run.stdout + run.stderr)[-8000:]
    summary = summaries(workdir)[point]
    results = summary["results"]
    assert summary["provenance"]["hosts"] == ["n1", "n2"] and summary["run"]["nodes"] == 2
    assert (results["workload"], results["sample_unit"], results["parallelism"]) == ("gpt", "tokens", "fsdp")
    assert results["world_size"] == 2 and results["backend"] == "gloo" and results["window_filled"]
    assert len(results["peak_memory_bytes_per_rank"]) == 2
    assert slurm.job(summary["provenance"]["slurm"]["job_id"])["NodeList"] == "n[1-2]"
    log = (workdir / f"results/logs/{point}.log").read_text()
    assert re.search(r"checkpoint \S*dcp-000000004", log), log[-3000:]  # both ranks wrote their shards


def test_a_second_bring_up_never_stops_the_running_cluster(slurm):
    """tests/slurm/cluster.sh takes a lock: bring-ups started together, or one of the other kind,
    leave the running slurmctld alone."""
    pidfile = SLURM_STATE / "run/slurmctld.pid"
    pid = pidfile.read_text()
    other = cluster_script("up-two-node", accounting=True, timeout=120)
    assert other.returncode == 1 and "not replacing" in other.stderr, other.stderr
    together = [
        subprocess.Popen(["bash", str(CLUSTER_SH), "up-two-node"], stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    for process in together:
        _, stderr = process.communicate(timeout=120)
        assert process.returncode == 0 and "already up" in stderr, stderr
    assert pidfile.read_text() == pid
    assert cluster_script("status").stdout.split() == ["up", str(slurm.nodes), "no-accounting"]


@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_slurm_accepts_the_real_studys_gpu_requests(slurm, world, tmp_path):
    """config/config.yaml's geometry (4 GPUs per node), with CPUs and memory shrunk to the toy
    nodes, through the plugin's own sbatch builder, checked by `sbatch --test-only`."""
    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    config["cluster"].update(cpus_per_rank=1, mem_mb_per_rank=100)
    nodes, per_node = cluster.layout(config, world)
    if nodes > slurm.nodes:
        pytest.skip(f"world {world} needs {nodes} nodes; the test cluster has {slurm.nodes}")
    sbatch = slurm_requests.sbatch_command(cluster.train_resources(config, world, 1), threads=world)
    result = slurm.run("sh", "-c", f"{sbatch} --test-only --wrap=true", cwd=tmp_path)
    assert result.returncode == 0, f"{sbatch}\n{result.stderr}"
    match = re.search(r"using (\d+) processors on nodes (\S+)", result.stderr)
    assert match, result.stderr
    assert int(match[1]) == world  # one CPU per rank here
    hosts = subprocess.run(
        [*slurm.client, "scontrol", "show", "hostnames", match[2]], capture_output=True, text=True
    ).stdout.split()
    assert len(hosts) == nodes, (sbatch, result.stderr)
    assert shlex.split(sbatch).count(f"--gres=gpu:{per_node}") == 1


# ----------------------------------------------------------------------------- with accounting


@pytest.fixture(scope="module")
def demo_accounting(clusters, tmp_path_factory):
    """The same documented commands on a cluster with accounting, jobs charged to an account, as a
    user runs them on a big grid: the profiles' groups of short jobs, and job arrays for the rules
    `python -m scalestudy.plan.arrays` finds safe (none in this smaller grid: its one sensitivity
    point, and world 2 spans both nodes)."""
    slurm = clusters.get(accounting=True)
    workdir = copy_workflow(tmp_path_factory.mktemp("slurm-demo-accounting") / "scalestudy")
    configfile = write_config(workdir, "slurm-demo.yaml", shorter_demo(slurm, account=ACCOUNT))
    config = yaml.safe_load((workdir / configfile).read_text())
    safe = ",".join(rule for rule, why_not in arrays.array_rules(config).items() if why_not is None)
    before = controller_submissions()
    output = run_documented_demo(slurm, workdir, configfile, *(["--slurm-array-jobs", safe] if safe else []))
    SBATCH_CALLS["grouped"] = controller_submissions() - before
    return workdir, configfile, output


def test_the_documented_commands_finish_the_demo_on_a_cluster_with_accounting(
    demo_accounting, slurm_accounting
):
    workdir, configfile, output = demo_accounting
    slurm = slurm_accounting
    assert slurm.run("sacct", "-X", "-n").returncode == 0
    assert (workdir / "results/report.html").stat().st_size > 100_000
    jobs = check_jobs(slurm, workdir, output, configfile)
    check_run_records(slurm, workdir, output, account=ACCOUNT)
    for job_id in jobs:
        assert slurm.job(job_id)["Account"] == ACCOUNT
    sacct = json.loads((workdir / "results/tables/sacct.json").read_text())
    assert sacct["note"] is None and sacct["jobs"], sacct
    rows = catalog(workdir)
    assert set(rows["sacct.state"]) == {"COMPLETED"}, rows["sacct.state"]
    assert "no SLURM account" not in output and "invalid option" not in output


# The results tables' columns that say what was learned (not how fast): loss, accuracy, steps, ranks.
LEARNING = re.compile(
    r"(^|\.)(world_size|epochs|steps|final_train_loss|final_test_loss|final_test_acc|best_test_acc)$"
)


def local_catalog(workdir: Path, configfile: str, scratch: Path) -> pd.DataFrame:
    """results/tables/runs.csv of the local executor on workdir's config (its training points and
    the catalog only, on workdir's data: no fetch/preprocess again), run once per config and
    session: kept in the session's `scratch` folder (the Slurm routes of two test modules compare to
    it, and pytest may import this module once for each of them)."""
    text = (workdir / configfile).read_text()
    config = yaml.safe_load(text)
    config["cluster"].pop("account", None)  # which Slurm account paid is no setting of the local run
    key = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]
    kept = scratch / "local-catalogs" / f"{key}.csv"
    if not kept.is_file():
        local = copy_workflow(scratch / f"local-{key}" / "scalestudy")
        shutil.copytree(workdir / "results/data", local / "results/data")
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


def test_grouped_short_jobs_halve_the_sbatch_calls_and_learn_what_the_local_executor_learns(
    demo, demo_accounting, slurm_accounting, tmp_path_factory
):
    """Issue 22, the same smaller demo twice: every job on its own (`demo`, as before) and as a user
    runs it now (`demo_accounting`: the profiles' groups of short jobs, and arrays where safe). The
    second makes at most half the sbatch calls (slurmctld's log, and Snakemake's own count); its
    preflight is ONE Slurm job shaped like the grid's largest training job; and its run catalog's
    learning columns equal those of the local executor on the same config (throughput and timings
    aside), run here for the catalog only (what its training points need)."""
    _, _, separate_output = demo
    workdir, configfile, output = demo_accounting
    before, after = SBATCH_CALLS["separate"], SBATCH_CALLS["grouped"]
    print(f"sbatch calls of the smaller demo: {before} as separate jobs, {after} grouped")
    assert "Group job" not in separate_output and before == len(submitted(separate_output)), before
    assert after == len(submitted(output)) and after <= before / 2, (before, after)
    config = yaml.safe_load((workdir / configfile).read_text())
    logs = workdir / ".snakemake/slurm_logs"
    jobs = {job: log.relative_to(logs).parts[0] for job, log in submitted(output).items()}
    (preflight,) = [job for job, folder in jobs.items() if folder.startswith(f"group_{groups.PREFLIGHT}_")]
    state = slurm_accounting.job(preflight)
    world = groups.preflight_world(config)
    assert state["JobState"] == "COMPLETED" and state["NumTasks"] == str(world), state
    assert state["NumNodes"] == str(cluster.layout(config, world)[0]), state

    assert_learns_what_the_local_executor_learns(workdir, configfile, tmp_path_factory.getbasetemp())


def test_a_changed_value_reruns_exactly_the_points_that_carry_it_through_slurm(
    demo_accounting, slurm_accounting
):
    """sensitivity.epochs is carried by the sensitivity points only: they (and what reads them)
    re-run with new outputs, no job fails, every other run is left as it was."""
    workdir, configfile, _ = demo_accounting
    before = summaries(workdir)
    config = yaml.safe_load((workdir / configfile).read_text())
    config["sensitivity"]["epochs"] += 1
    (workdir / configfile).write_text(yaml.safe_dump(config, sort_keys=False))
    run = snakemake(slurm_accounting, workdir, configfile, timeout=900)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-8000:]
    assert "Error in rule" not in output and "SLURM-job failed" not in output, output[-4000:]
    after = summaries(workdir)
    assert set(after) == set(before)
    changed = {point for point in after if after[point]["provenance"] != before[point]["provenance"]}
    sensitivity = {point for point in after if point.startswith("sensitivity/")}
    assert sensitivity and changed == sensitivity, (changed, sensitivity)
    for point in sensitivity:
        assert after[point]["run"]["epochs"] == config["sensitivity"]["epochs"]
        assert after[point]["results"]["resumed_from_step"] is None  # a fresh run, not a resume
    trained = set(re.findall(r"^rule (\w+_run):", output, re.M))
    assert trained == {"sensitivity_run"}, trained


def test_a_deleted_summary_is_measured_afresh_through_slurm(demo_accounting, slurm_accounting):
    workdir, configfile, _ = demo_accounting
    point = "scaling/strong/w2_r0"
    old = summaries(workdir)[point]
    target = f"results/runs/{point}/summary.json"
    (workdir / target).unlink()
    run = snakemake(slurm_accounting, workdir, configfile, target, timeout=600)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-8000:]
    new = json.loads((workdir / target).read_text())
    assert new["provenance"]["slurm"]["job_id"] != old["provenance"]["slurm"]["job_id"]
    assert new["provenance"]["timestamp"] != old["provenance"]["timestamp"]
    assert new["results"]["resumed_from_step"] is None, new["results"]  # measured, not resumed
    assert new["results"]["total_time_s"] != old["results"]["total_time_s"]


def bad_config(workdir: Path, slurm: Cluster, name: str, **cluster) -> str:
    """The accounting demo's config with `cluster` settings changed (and the point it would run first
    changed too), as a new config file of workdir."""

    def change(config: dict) -> None:
        shorter_demo(slurm, account=ACCOUNT)(config)
        config["cluster"].update(cluster)
        config["smoke"]["train_steps"] += 1  # the preflight group runs again: the first job submitted

    return write_config(workdir, name, change)


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"partition": "nosuchpart"}, "cluster.partition: 'nosuchpart' is not a partition of this cluster; "
         "its partitions (sinfo): debug"),
        ({"account": "nosuchacct"}, "cluster.account: 'nosuchacct' is not an account of user 'root' on this "
         f"cluster; the user's accounts (sacctmgr show association): root, {ACCOUNT}"),
        ({"qos": "nosuchqos"}, "cluster.qos: 'nosuchqos' is not a QOS of this cluster"),
    ],
)  # fmt: skip
def test_a_name_the_cluster_does_not_know_stops_the_run_in_seconds_with_nothing_submitted(
    demo_accounting, slurm_accounting, setting, message
):
    """docs/slurm.md followed with a partition, account or QOS the cluster does not have: the run stops
    before its first submission, naming the setting and what the cluster has (sinfo, sacctmgr)."""
    workdir, _, _ = demo_accounting
    badconfig = bad_config(workdir, slurm_accounting, f"slurm-bad-{next(iter(setting))}.yaml", **setting)
    before, started = controller_submissions(), time.monotonic()
    run = snakemake(slurm_accounting, workdir, badconfig, timeout=300)
    output = run.stdout + run.stderr
    assert run.returncode != 0 and message in output, output[-4000:]
    assert "nothing was submitted" in output and controller_submissions() == before
    assert time.monotonic() - started < 60


def test_without_accounting_an_account_is_taken_with_a_warning_that_it_cannot_be_checked(demo, slurm):
    """The preview command (docs/slurm.md) runs the same check as the workflow: on a cluster without
    accounting Slurm accepts any account, which is a warning saying so, not an error."""
    workdir, _, _ = demo
    badconfig = bad_config(workdir, slurm, "slurm-acct.yaml", account="nosuchacct", partition="debug")
    preview = slurm.run(
        sys.executable, "-m", "scalestudy.plan.slurm_requests", "--configfile", badconfig,
        cwd=workdir, env=snakemake_env(), timeout=120,
    )  # fmt: skip
    assert preview.returncode == 0, preview.stdout[-2000:] + preview.stderr[-2000:]
    assert "warning: cluster.account 'nosuchacct' cannot be checked: this cluster keeps no accounting" in (
        preview.stdout
    )
    assert "error:" not in preview.stdout


def test_an_sbatch_refusal_inside_a_group_shows_sbatchs_message_and_no_earlier_runs_log(
    demo_accounting, slurm_accounting
):
    """Memory above what a node has: sbatch refuses the preflight group. Snakemake says "message: None"
    for a group; the workflow prints sbatch's own message when it ends, and the earlier run's logs of
    the refused jobs are set aside (never shown as this run's)."""
    workdir, _, _ = demo_accounting
    earlier = workdir / "results/logs/smoke/train_w2.log"
    earlier_text = earlier.read_text()
    assert earlier_text.strip(), "the demo left no smoke log"
    badconfig = bad_config(workdir, slurm_accounting, "slurm-bigmem.yaml", mem_mb_per_rank=50_000_000)
    run = snakemake(slurm_accounting, workdir, badconfig, "--retries", "0", timeout=300)
    output = run.stdout + run.stderr
    assert run.returncode != 0, output[-4000:]
    refusal = output.split("sbatch refused these submissions of this run:", 1)
    assert len(refusal) == 2, output[-4000:]
    assert "rule_preflight" in refusal[1] and "Memory specification can not be satisfied" in refusal[1]
    assert earlier_text.splitlines()[0] not in output
    assert (workdir / "results/logs/smoke/train_w2.earlier.log").read_text() == earlier_text


def test_nothing_is_left_running(clusters):
    for accounting in (True, False):
        status = cluster_script("status").stdout.split()
        if status[2:3] == ["accounting" if accounting else "no-accounting"]:
            slurm = Cluster(int(status[1]), accounting)
            queue = slurm.run("squeue", "--noheader", "--states=PENDING,RUNNING", "-o", "%i %j %T")
            assert queue.returncode == 0 and not queue.stdout.strip(), queue.stdout
