"""The names a config gives the cluster (partition, account, QOS), checked against what sinfo and
sacctmgr answer before anything is submitted; sbatch's refusals kept for the end of the run; an
earlier run's log set aside before its job is submitted again. The same checks run on the real test
cluster in tests/test_slurm.py."""

from __future__ import annotations

import time

import pytest

from scalestudy.launch import attempt_logs, submit_retry
from scalestudy.plan import slurm_names

NO_ACCOUNTING = "sacctmgr: error: Problem talking to the database: Connection refused"


def cluster_answers(partitions=("debug", "gpu"), associations=None, qos=("normal", "high")):
    """A stand-in for sinfo/sacctmgr: associations None means a cluster without accounting."""

    def run(command):
        if command[0] == "sinfo":
            return 0, "".join(f"{name}\n" for name in partitions), ""
        if associations is None:
            return 1, "", NO_ACCOUNTING
        if "association" in command:
            return 0, "".join(f"{account}|{','.join(names)}\n" for account, names in associations), ""
        return 0, "".join(f"{name}\n" for name in qos), ""

    return run


def config_with(demo_config, **cluster):
    return {**demo_config, "cluster": {**demo_config["cluster"], **cluster}}


def test_an_unknown_partition_is_an_error_naming_it_and_the_partitions_that_exist(demo_config):
    findings = slurm_names.check(config_with(demo_config, partition="nosuchpart"), cluster_answers())
    assert findings.errors == [
        "cluster.partition: 'nosuchpart' is not a partition of this cluster; "
        "its partitions (sinfo): debug, gpu"
    ]


def test_known_names_pass_and_unset_names_are_not_asked_for(demo_config):
    asked = []

    def run(command):
        asked.append(command[0])
        return cluster_answers(associations=[("studyacct", ["normal"])])(command)

    findings = slurm_names.check(
        config_with(demo_config, partition="gpu", cpu_partition="debug", account="studyacct", qos="normal"),
        run,
    )
    assert findings.errors == [] and findings.warnings == []
    asked.clear()
    assert slurm_names.check(demo_config, run).errors == [] and asked == []  # nothing named, nothing asked


def test_an_unknown_cpu_partition_is_named_too(demo_config):
    findings = slurm_names.check(config_with(demo_config, cpu_partition="cpus"), cluster_answers())
    assert len(findings.errors) == 1 and findings.errors[0].startswith("cluster.cpu_partition: 'cpus'")


def test_an_account_the_user_does_not_have_is_an_error_listing_the_users_accounts(demo_config):
    answers = cluster_answers(associations=[("proj-a", ["normal"]), ("proj-b", ["normal"])])
    findings = slurm_names.check(config_with(demo_config, account="proj-c"), answers, user="alice")
    assert findings.errors == [
        "cluster.account: 'proj-c' is not an account of user 'alice' on this cluster; the user's "
        "accounts (sacctmgr show association): proj-a, proj-b"
    ]


@pytest.mark.parametrize(
    ("qos", "message"),
    [
        (
            "urgent",
            "cluster.qos: 'urgent' is not a QOS of this cluster; its QOS (sacctmgr show qos): high, normal",
        ),
        ("high", "cluster.qos: 'high' is not allowed for account 'proj-a'; allowed QOS: normal"),
    ],
)
def test_a_qos_that_does_not_exist_or_is_not_allowed_is_an_error(demo_config, qos, message):
    answers = cluster_answers(associations=[("proj-a", ["normal"]), ("proj-b", ["high"])])
    findings = slurm_names.check(config_with(demo_config, account="proj-a", qos=qos), answers, user="alice")
    assert findings.errors == [message]


def test_without_accounting_an_account_is_a_warning_that_says_it_cannot_be_checked(demo_config):
    findings = slurm_names.check(config_with(demo_config, account="nosuchacct"), cluster_answers())
    assert findings.errors == []
    assert findings.warnings == [
        "cluster.account 'nosuchacct' cannot be checked: this cluster keeps no accounting "
        f"({NO_ACCOUNTING}), so Slurm accepts any account or QOS name without checking it"
    ]


def test_without_sinfo_the_partition_is_a_warning(demo_config):
    def run(command):
        return slurm_names.run_command(["/nonexistent/sinfo"])

    findings = slurm_names.check(config_with(demo_config, partition="gpu"), run)
    assert findings.errors == [] and "the partitions cannot be checked: sinfo failed" in findings.warnings[0]


def test_the_refusals_logged_since_a_time_are_returned_with_sbatchs_message(tmp_path):
    log = tmp_path / "sbatch-retries.log"
    retry = submit_retry.Retry(patience_s=0, log_path=str(log), label="rule_preflight_a_b")
    retry.log("refused by the submit limit QOSMaxSubmitJobPerUserLimit (try 1): trying again in 30 s")
    started = time.time()
    retry.log(f"{submit_retry.REFUSED} (exit 1): sbatch: error: invalid partition specified: x", echo=False)
    old = "2001-01-01T00:00:00 sbatch (scalestudy) rule_old: refused (exit 1): sbatch: error: long ago"
    log.write_text(old + "\n" + log.read_text())
    assert submit_retry.refusals_since(str(log), started) == [
        "rule_preflight_a_b: refused (exit 1): sbatch: error: invalid partition specified: x"
    ]
    assert submit_retry.refusals_since(str(tmp_path / "absent.log"), started) == []


def test_the_wrapper_logs_a_refusal_it_passes_through(tmp_path, capsys):
    """A fake sbatch that refuses: the wrapper passes its exit code and stderr on, and logs the
    refusal once, on one line, without echoing it a second time."""
    fake = tmp_path / "sbatch"
    fake.write_text(
        "#!/bin/sh\necho 'sbatch: error: Memory specification can not be satisfied' >&2\nexit 1\n"
    )
    fake.chmod(0o755)
    log = tmp_path / "sbatch.log"
    retry = submit_retry.Retry(patience_s=0, log_path=str(log), label="rule_x")
    result = submit_retry.submit([str(fake)], None, retry)
    assert result.returncode == 1 and b"Memory specification" in result.stderr
    assert "Memory specification" not in capsys.readouterr().err
    assert (
        log.read_text().count("refused (exit 1): sbatch: error: Memory specification can not be satisfied")
        == 1
    )


def test_an_earlier_log_is_set_aside_and_replaces_an_older_one(tmp_path):
    log = tmp_path / "logs" / "w2.log"
    assert attempt_logs.set_aside(log) is None  # nothing to set aside
    log.parent.mkdir()
    log.write_text("the earlier run\n")
    (tmp_path / "logs" / "w2.earlier.log").write_text("an older run\n")
    kept = attempt_logs.set_aside(log)
    assert kept == tmp_path / "logs" / "w2.earlier.log" and kept.read_text() == "the earlier run\n"
    assert not log.exists()
