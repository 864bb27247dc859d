"""The demo study on a real (throw-away) two-node Slurm cluster with accounting (mariadb + slurmdbd;
tests/slurm_cluster.py; skipped with the reason without root and apt-get), run ONCE and read by
every test here (issue 45):

- docs/guide/cluster.md's container-less commands, run as written (only the config file is the test's and
  status polling faster), finish the demo study (a smaller grid) to the report, as the profiles run
  it (groups of short jobs: at most half the sbatch calls of separate jobs); two-rank points span
  both nodes; the run catalog names each Slurm job (name, nodes, account, attempts) and learns what
  the local executor learns;
- a real `mlflow server` on the submit host tracks every point (its Slurm job and node list) and
  its UI (headless Chromium) lists them; `system` and the collective benchmark span both nodes;
- re-runs through Slurm: a changed value re-runs exactly its points; a deleted summary.json is
  measured afresh; names the cluster does not know, and an sbatch refusal, stop the run clearly.

Without accounting: tests/test_slurm_no_accounting.py. Time limits and job arrays:
tests/test_slurm_array_faults.py. A cluster that was up before is left up, one brought up here is
brought down."""

# ruff: noqa: F811 - the cluster fixtures (clusters, slurm_accounting) are tests/slurm_cluster.py's

from __future__ import annotations

import json
import re
import time

import pytest
import yaml

from scalestudy.benchmark import dag
from scalestudy.plan import arrays, cluster, groups
from tests import mlflow_server
from tests.conftest import copy_workflow
from tests.mlflow_server import start_server, stop_server
from tests.slurm_cluster import (  # noqa: F401 - the cluster fixtures, taken as arguments
    ACCOUNT,
    CLUSTER_SH,
    MLFLOW_PORT,
    READ_STORES,
    SLURM_STATE,
    Cluster,
    artifacts,
    assert_learns_what_the_local_executor_learns,
    bad_config,
    catalog,
    check_jobs,
    check_run_records,
    cluster_script,
    clusters,
    controller_submissions,
    mlflow_run,
    mlflow_store,
    rows,
    run_documented_demo,
    shorter_demo,
    slurm_accounting,
    snakemake,
    status_history,
    store_runs,
    submitted,
    summaries,
    write_config,
)

pytestmark = pytest.mark.slurm


# ----------------------------------------------------------------------------- with accounting


@pytest.fixture(scope="module")
def demo_accounting(clusters, tmp_path_factory):
    """The demo study (a smaller grid) through docs/guide/cluster.md's container-less commands on a cluster
    with accounting, jobs charged to an account, as a user runs them on a big grid: the profiles'
    groups of short jobs, and job arrays for the rules `python -m scalestudy.plan.arrays` finds safe
    (none in this smaller grid: its one sensitivity point, and world 2 spans both nodes); tracked by
    a real MLflow server (tracking.uri) on the submit host. Every test of the study reads this one
    run (issue 45)."""
    slurm = clusters.get(accounting=True)
    root = tmp_path_factory.mktemp("slurm-demo-accounting")
    workdir = copy_workflow(root / "scalestudy")
    (root / "mlflow-server").mkdir()
    server = start_server(root / "mlflow-server", MLFLOW_PORT, via=slurm.client)

    def change(config: dict) -> None:
        shorter_demo(slurm, account=ACCOUNT)(config)
        config["tracking"] = {"uri": f"http://127.0.0.1:{MLFLOW_PORT}"}

    configfile = write_config(workdir, "slurm-demo.yaml", change)
    READ_STORES[workdir] = f"sqlite:///{root / 'mlflow-server/mlflow.db'}"
    config = yaml.safe_load((workdir / configfile).read_text())
    safe = ",".join(rule for rule, why_not in arrays.array_rules(config).items() if why_not is None)
    before = controller_submissions()
    try:
        output = run_documented_demo(
            slurm, workdir, configfile, *(["--slurm-array-jobs", safe] if safe else [])
        )
        yield workdir, configfile, output, controller_submissions() - before
    finally:
        stop_server(server)


def test_the_documented_commands_finish_the_demo_on_a_cluster_with_accounting(
    demo_accounting, slurm_accounting
):
    workdir, configfile, output, _ = demo_accounting
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


def test_the_paper_and_the_report_say_slurm_ran_the_study(demo_accounting, slurm_accounting):
    """Issue 54: where Slurm ran the demo, its paper and report say so, with Slurm's version (the
    local demo's name no Slurm: tests/test_workflow.py)."""
    from tests.paper_text import paper_and_report

    workdir, _, _, _ = demo_accounting
    paper, report = paper_and_report(workdir)
    paper = " ".join(paper.split())
    assert "scales on a Slurm cluster," in paper and r"Slurm~\cite{slurm}" in paper
    assert r"with its Slurm executor plugin~\cite{snakemakeslurm}" in paper
    assert "the hosts and the Slurm job" in paper and "Slurm's own energy accounting of the jobs:" in paper
    assert "local executor" not in paper
    ran = r"Slurm( \(version [^)]*\))? ran the \d+ training runs as \d+ Slurm jobs"
    assert re.search(ran, report), re.findall(r".{200}Slurm.{200}", report)
    assert "the Slurm job id and node list" in report


def test_a_two_rank_point_spans_both_nodes_with_one_result(demo_accounting, slurm_accounting):
    if slurm_accounting.nodes < 2:
        pytest.skip("network namespaces are unavailable here: the cluster has one node")
    workdir, _, _, _ = demo_accounting
    run = summaries(workdir)["scaling/strong/w2_r0"]
    assert run["provenance"]["hosts"] == ["n1", "n2"] and run["run"]["nodes"] == 2
    assert run["results"]["world_size"] == 2 and run["results"]["backend"] == "gloo"
    assert slurm_accounting.job(run["provenance"]["slurm"]["job_id"])["NodeList"] == "n[1-2]"
    assert sorted(p.name for p in (workdir / "results/runs/scaling/strong/w2_r0").glob("summary*")) == [
        "summary.json"
    ]
    log = (workdir / "results/logs/scaling/strong/w2_r0.log").read_text()
    assert "but the ranks run on" not in log, log[-3000:]  # the run config's nodes are the layout's


def test_system_and_comm_bench_ran_as_slurm_jobs(demo_accounting, slurm_accounting):
    """Each in a Slurm job of the grid's largest shape (both nodes): its own (`rule_system`,
    `rule_comm_bench`) or, as the profiles group the short jobs, the preflight group's one job."""
    workdir, _, output, _ = demo_accounting
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
        state = slurm_accounting.job(job_id)
        assert state["JobState"] == "COMPLETED", state
        assert state["NumNodes"] == str(slurm_accounting.nodes)


def test_the_system_table_lists_every_host(demo_accounting, slurm_accounting):
    workdir, _, _, _ = demo_accounting
    table = rows(workdir / "results/tables/system.csv")
    expected = ["n1", "n2"][: slurm_accounting.nodes]
    assert sorted(row["host"] for row in table) == expected
    for row in table:
        assert row["kind"] == "compute" and row["gpu_model"] == "none"  # CPU nodes: said, not guessed
        assert row["slurm"].startswith("slurm") and int(row["logical_cpus"]) >= 1
        assert (workdir / "results/system" / f"{row['host']}.json").is_file()


def test_comm_bench_spans_the_nodes(demo_accounting, slurm_accounting):
    workdir, _, _, _ = demo_accounting
    bench = rows(workdir / "results/comm/busbw.csv")
    assert {row["collective"] for row in bench} == {"all_reduce", "all_gather", "reduce_scatter"}
    placement = "inter-node" if slurm_accounting.nodes == 2 else "intra-node"
    for row in bench:
        assert row["world_size"] == "2" and row["backend"] == "gloo" and row["placement"] == placement
        assert row["hosts"] == " ".join(["n1", "n2"][: slurm_accounting.nodes])
        assert float(row["time_s"]) > 0 and row["provenance.slurm.job_id"]
    fit = rows(workdir / "results/tables/comm_bench_fit.csv")
    assert {row["placement"] for row in fit} == {placement}
    for row in fit:  # a loaded host can time a larger message no slower: no slope, no bandwidth
        if float(row["beta_s_per_byte"]) > 0:
            assert float(row["bandwidth_gb_s"]) > 0, row
        else:
            assert row["bandwidth_gb_s"] == "", row


def test_every_points_mlflow_run_names_its_slurm_job_and_nodes(demo_accounting, slurm_accounting):
    """The demo's MLflow server: each training point's run went RUNNING when its job started on a
    compute node (its journal's start record, sent by the study's follower on the submit host) and
    FINISHED, and its tags name the Slurm job and node list that summary.json's provenance and
    Slurm itself name; rule track gave it its files and the study's run the tables and figures."""
    workdir, configfile, output, _ = demo_accounting
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
        assert tags.get("slurm.job_ids") == job_id == recorded["slurm_job_id"], (
            point,
            tags,
            job_id,
        )
        assert job_id in submitted(output), f"{point}: job {job_id} is not one Snakemake submitted"
        nodelist = slurm_accounting.job(job_id)["NodeList"]
        assert tags.get("slurm.nodelists") == nodelist == recorded["slurm"]["job_nodelist"], (
            point,
            tags,
        )
        assert tags.get("hosts") == ",".join(recorded["hosts"]), (point, tags)
        assert tags.get("attempt") == "1" and tags.get("world_size") == str(summary["run"]["world_size"])
        assert {"summary.json", "metrics.csv", "logs"} <= set(
            artifacts(slurm_accounting, workdir, run.info.run_id)
        ), point
    two_nodes = runs["scaling/strong/w2_r0"]
    if slurm_accounting.nodes == 2:
        run = mlflow_run(client, experiment, "scaling/strong/w2_r0", two_nodes)
        assert run.data.tags["slurm.nodelists"] == "n[1-2]" and run.data.tags["hosts"] == "n1,n2"
    (study,) = store_runs(client, experiment, "study")
    assert {"tables", "figures"} <= set(artifacts(slurm_accounting, workdir, study.info.run_id))


@pytest.fixture(scope="module")
def chromium():
    return mlflow_server.chromium_binary()


def test_the_mlflow_ui_lists_every_point_of_the_demo_and_draws_a_metric_chart(
    demo_accounting, slurm_accounting, chromium, tmp_path
):
    """The server's UI, in headless Chromium on the submit host (as a user opens it through an SSH
    tunnel): the experiment page lists every training point of the demo, and a point's metric chart
    renders. SCALESTUDY_SCREENSHOT_DIR=docs/figures keeps the screenshot (the README's)."""
    workdir, configfile, _, _ = demo_accounting
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
        run.info.run_id, tmp_path, via=slurm_accounting.client,
    )  # fmt: skip


def test_grouped_short_jobs_halve_the_sbatch_calls_and_learn_what_the_local_executor_learns(
    demo_accounting, slurm_accounting, tmp_path_factory
):
    """Issue 22, on the demo as a user runs it (the profiles' groups of short jobs, and arrays where
    safe): at most half the sbatch calls (slurmctld's log, and Snakemake's own count) of the jobs
    its plan sends to the cluster (Snakemake's "Job stats" less the submit host's rules), each of
    which would be one sbatch call on its own; its preflight is ONE Slurm job shaped like the grid's
    largest training job; and its run catalog's learning columns equal those of the local executor
    on the same config (throughput and timings aside), run here for the catalog only (what its
    training points need)."""
    workdir, configfile, output, grouped = demo_accounting
    config = yaml.safe_load((workdir / configfile).read_text())
    planned = dag.job_counts(output)
    on_cluster = {
        rule: n for rule, n in planned.items() if rule != "all" and not cluster.on_submit_host(config, rule)
    }
    separate = sum(on_cluster.values())
    print(f"sbatch calls of the smaller demo: {separate} jobs on the cluster, {grouped} sbatch calls grouped")
    assert separate > 10 and "Group job" in output, planned
    assert grouped == len(submitted(output)) and grouped <= separate / 2, (separate, grouped)
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
    """sensitivity.epochs is carried by the sensitivity points only: asked for the run catalog, they
    (and the catalog) re-run with new outputs, no job fails, every other run is left as it was. (The
    figures and the paper after the catalog would re-run too: Snakemake's own propagation, with the
    light jobs the demo's first run already took through Slurm; not run again here, issue 45.)"""
    workdir, configfile, _, _ = demo_accounting
    before = summaries(workdir)
    config = yaml.safe_load((workdir / configfile).read_text())
    config["sensitivity"]["epochs"] += 1
    (workdir / configfile).write_text(yaml.safe_dump(config, sort_keys=False))
    run = snakemake(slurm_accounting, workdir, configfile, "results/tables/runs.csv", timeout=900)
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
    workdir, configfile, _, _ = demo_accounting
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
    """docs/guide/cluster.md followed with a partition, account or QOS the cluster does not have: the run
    stops before its first submission, naming the setting and what the cluster has (sinfo, sacctmgr)."""
    workdir, _, _, _ = demo_accounting
    badconfig = bad_config(workdir, slurm_accounting, f"slurm-bad-{next(iter(setting))}.yaml", **setting)
    before, started = controller_submissions(), time.monotonic()
    run = snakemake(slurm_accounting, workdir, badconfig, timeout=300)
    output = run.stdout + run.stderr
    assert run.returncode != 0 and message in output, output[-4000:]
    assert "nothing was submitted" in output and controller_submissions() == before
    assert time.monotonic() - started < 60


def test_an_sbatch_refusal_inside_a_group_shows_sbatchs_message_and_no_earlier_runs_log(
    demo_accounting, slurm_accounting
):
    """Memory above what a node has: sbatch refuses the preflight group. Snakemake says "message: None"
    for a group; the workflow prints sbatch's own message when it ends, and the earlier run's logs of
    the refused jobs are set aside (never shown as this run's)."""
    workdir, _, _, _ = demo_accounting
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
