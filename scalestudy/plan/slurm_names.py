"""The config's partition, account and QOS, checked against the cluster before anything is submitted.

A name the cluster does not know makes sbatch refuse the job, but only when Snakemake submits it, and
Snakemake reports a refusal inside a group job as "message: None" (docs/guide/cluster.md, "When sbatch
refuses a job"). So the workflow asks the cluster itself first (an onstart hook under the Slurm
executor; `python -m scalestudy.plan.slurm_requests` does the same):

- partitions: `sinfo --noheader --format=%R`, every partition the cluster has;
- accounts and QOS: `sacctmgr --noheader --parsable2 show association user=<user>`, the accounts
  and QOS the user may submit with, and `sacctmgr show qos` for the QOS that exist.

A name the cluster does not know is an error naming the key, the value and the names that exist. Where
the cluster keeps no accounting (sacctmgr fails), Slurm accepts any account and QOS name without a
word; that is a warning saying so, never an error. Standard library only.
"""

from __future__ import annotations

import getpass
import os
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from scalestudy.plan import cluster

TIMEOUT_S = 30
# Runs a command, returns (exit code, stdout, stderr): a test may pass a stand-in.
Runner = Callable[[Sequence[str]], tuple[int, str, str]]


def run_command(command: Sequence[str]) -> tuple[int, str, str]:
    try:
        done = subprocess.run(list(command), capture_output=True, text=True, timeout=TIMEOUT_S)
    except FileNotFoundError:
        return 127, "", f"{command[0]}: not found"
    except subprocess.TimeoutExpired:
        return 124, "", f"{command[0]}: no answer in {TIMEOUT_S} s"
    return done.returncode, done.stdout, done.stderr


@dataclass
class Findings:
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "no message")


def partitions(run: Runner) -> tuple[set[str] | None, str]:
    """The cluster's partitions (None where sinfo does not answer) and sinfo's message."""
    code, out, err = run(["sinfo", "--noheader", "--format=%R"])
    if code != 0:
        return None, _first_line(err)
    return {line.strip() for line in out.splitlines() if line.strip()}, ""


def associations(run: Runner, user: str) -> tuple[list[tuple[str, set[str]]] | None, str]:
    """(account, QOS the association allows) of every association of `user`; None without accounting."""
    code, out, err = run(
        ["sacctmgr", "--noheader", "--parsable2", "show", "association", f"user={user}", "format=account,qos"]
    )
    if code != 0:
        return None, _first_line(err)
    found = []
    for line in out.splitlines():
        account, _, qos = line.strip().partition("|")
        if account:
            found.append((account, {name for name in qos.split(",") if name}))
    return found, ""


def qos_names(run: Runner) -> set[str] | None:
    code, out, _ = run(["sacctmgr", "--noheader", "--parsable2", "show", "qos", "format=name"])
    return {line.strip() for line in out.splitlines() if line.strip()} if code == 0 else None


def _listed(names) -> str:
    return ", ".join(sorted(names)) or "(none)"


def check_partitions(settings: dict, run: Runner, findings: Findings) -> None:
    wanted = {key: settings[key] for key in ("partition", "cpu_partition") if settings[key]}
    if not wanted:
        return
    known, message = partitions(run)
    if known is None:
        findings.warnings.append(f"the partitions cannot be checked: sinfo failed ({message})")
        return
    for key, name in wanted.items():
        if name not in known:
            findings.errors.append(
                f"cluster.{key}: {name!r} is not a partition of this cluster; its partitions "
                f"(sinfo): {_listed(known)}"
            )


def check_account_and_qos(settings: dict, run: Runner, findings: Findings, user: str) -> None:
    account, qos = settings["account"], settings["qos"]
    if not account and not qos:
        return
    found, message = associations(run, user)
    named = " and ".join(f"cluster.{key} {settings[key]!r}" for key in ("account", "qos") if settings[key])
    if found is None:
        findings.warnings.append(
            f"{named} cannot be checked: this cluster keeps no accounting ({message}), so "
            "Slurm accepts any account or QOS name without checking it"
        )
        return
    accounts = {name for name, _ in found}
    if account and account not in accounts:
        findings.errors.append(
            f"cluster.account: {account!r} is not an account of user {user!r} on this cluster; the "
            f"user's accounts (sacctmgr show association): {_listed(accounts)}"
        )
    if qos:
        check_qos(qos, account, found, qos_names(run), user, findings)


def check_qos(qos: str, account, found, existing: set[str] | None, user: str, findings: Findings) -> None:
    if existing is not None and qos not in existing:
        findings.errors.append(
            f"cluster.qos: {qos!r} is not a QOS of this cluster; "
            f"its QOS (sacctmgr show qos): {_listed(existing)}"
        )
        return
    allowed = set().union(*(names for name, names in found if not account or name == account))
    if allowed and qos not in allowed:
        where = f"account {account!r}" if account else f"user {user!r}"
        findings.errors.append(
            f"cluster.qos: {qos!r} is not allowed for {where}; allowed QOS: {_listed(allowed)}"
        )


def check(config: dict, run: Runner = run_command, user: str | None = None) -> Findings:
    """Errors (names the cluster does not know) and warnings (what could not be checked)."""
    settings = cluster.settings(config)
    findings = Findings()
    check_partitions(settings, run, findings)
    check_account_and_qos(settings, run, findings, user or os.environ.get("USER") or getpass.getuser())
    return findings


def report(findings: Findings) -> str:
    """The findings as the lines a user reads; empty when there is nothing to say."""
    lines = [f"error: {error}" for error in findings.errors]
    lines += [f"warning: {warning}" for warning in findings.warnings]
    return "\n".join(lines)
