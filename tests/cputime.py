"""The suite's cost at the end of every pytest session: wall time, CPU-seconds, the 20 costliest phases.

Each test's setup, call and teardown is charged the CPU time that the pytest process spent in it
plus that of every child process reaped in it (getrusage RUSAGE_SELF + RUSAGE_CHILDREN deltas). So:
- a process that a module fixture starts and a later teardown reaps (a server, a follower) is
  charged to the test whose teardown reaps it, not to the one that started it;
- a process that leaves pytest's tree (a daemon; the throw-away Slurm cluster's slurmd, and the jobs
  it runs under slurmstepd) is never reaped by pytest and is not in these numbers at all. The
  Slurm tests' own sbatch/srun/Snakemake processes are; the ranks of a Slurm job are not.
That is why the summary also prints the whole host's CPU-seconds over the session (from /proc/stat):
on a machine that runs only the suite (CI) it is the complete cost, the cluster included; on a shared
machine it counts the neighbours too.

Under pytest-xdist every worker measures its own tests and reports its session total when it ends;
the controller adds them to its own. With SCALESTUDY_CPU_REPORT=FILE the totals are also written
there as JSON (scripts/test.sh adds up its two sessions from them).
"""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path

import pytest

from scalestudy.atomic import write_json

SLOWEST = 20
MODULES = 10
REPORT_ENV = "SCALESTUDY_CPU_REPORT"


def process_cpu() -> tuple[float, float]:
    """(this process, its reaped children) CPU-seconds, user + system."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def process_age() -> float:
    """Seconds since this process started (/proc), or 0 where that cannot be read."""
    try:
        started = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, IndexError, ValueError):
        return 0.0
    return max(0.0, uptime - started / os.sysconf("SC_CLK_TCK"))


def host_cpu() -> float | None:
    """Busy CPU-seconds of the whole machine since boot (/proc/stat), or None where there is none."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return None
    # user nice system idle iowait irq softirq steal (guest time is already in user)
    busy = sum(int(fields[i]) for i in (0, 1, 2, 5, 6, 7) if i < len(fields))
    return busy / os.sysconf("SC_CLK_TCK")


class CpuClock:
    """The pytest plugin: registered by tests/conftest.py."""

    def __init__(self, config: pytest.Config):
        self.config = config
        self.wall0 = time.monotonic() - process_age()  # from the process's start: imports included
        self.host0 = host_cpu()
        self.phases: list[tuple[float, float, str, str]] = []  # (cpu_s, wall_s, when, nodeid)
        self.workers: list[dict] = []

    def _measure(self, item: pytest.Item, when: str):
        wall, cpu = time.monotonic(), sum(process_cpu())
        yield
        item.stash.setdefault(_COST, {})[when] = (sum(process_cpu()) - cpu, time.monotonic() - wall)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_setup(self, item):
        yield from self._measure(item, "setup")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item):
        yield from self._measure(item, "call")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_teardown(self, item):
        yield from self._measure(item, "teardown")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        cost = item.stash.get(_COST, {}).get(call.when)
        if cost is not None:  # plain attributes travel with the report from an xdist worker
            outcome.get_result().cpu_cost = list(cost)

    def pytest_runtest_logreport(self, report):
        cost = getattr(report, "cpu_cost", None)
        if cost is not None and not hasattr(self.config, "workeroutput"):
            self.phases.append((cost[0], cost[1], report.when, report.nodeid))

    def pytest_sessionfinish(self, session):
        if hasattr(self.config, "workeroutput"):  # an xdist worker: the controller adds it up
            own, children = process_cpu()
            self.config.workeroutput["cputime"] = json.dumps({"own": own, "children": children})

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error):
        total = getattr(node, "workeroutput", {}).get("cputime")
        if total:
            self.workers.append(json.loads(total))

    def totals(self) -> dict:
        own, children = process_cpu()  # since the process started
        if self.workers:  # the workers' own totals; their exit is not counted twice as children
            own += sum(worker["own"] for worker in self.workers)
            children = sum(worker["children"] for worker in self.workers)
        host = host_cpu()
        return {
            "wall_s": time.monotonic() - self.wall0,
            "cpu_s": own + children,
            "own_s": own,
            "children_s": children,
            "workers": len(self.workers),
            "host_cpu_s": None if host is None or self.host0 is None else host - self.host0,
        }

    def pytest_terminal_summary(self, terminalreporter):
        totals = self.totals()
        write = terminalreporter.write_line
        terminalreporter.section("CPU time (tests/cputime.py)")
        workers = f", {totals['workers']} xdist workers" if totals["workers"] else ""
        write(
            f"session: {totals['wall_s']:.0f} s wall, {totals['cpu_s']:.0f} CPU-s in pytest and the "
            f"processes it reaped (pytest {totals['own_s']:.0f} + children {totals['children_s']:.0f}"
            f"{workers})"
        )
        if totals["host_cpu_s"] is not None:
            write(f"the whole host over the session: {totals['host_cpu_s']:.0f} CPU-s (every process)")
        write(f"costliest {SLOWEST} phases (CPU-s, wall s; a fixture's process is charged to its reaper):")
        for cpu, wall, when, nodeid in sorted(self.phases, reverse=True)[:SLOWEST]:
            write(f"{cpu:8.1f} {wall:8.1f}  {when:<8} {nodeid}")
        modules = by_module(self.phases)
        write(
            f"costliest {MODULES} test modules (CPU-s, wall s, tests; every phase of their tests added up):"
        )
        for module, (cpu, wall, tests) in list(modules.items())[:MODULES]:
            write(f"{cpu:8.1f} {wall:8.1f} {tests:5d}  {module}")
        path = os.environ.get(REPORT_ENV)
        if path:
            write_json(path, {**totals, "modules": modules})


def by_module(phases: list[tuple[float, float, str, str]]) -> dict[str, tuple[float, float, int]]:
    """module path -> (CPU-s, wall s, tests) of its phases, costliest first."""
    sums: dict[str, list] = {}
    for cpu, wall, _, nodeid in phases:
        module = nodeid.split("::", 1)[0]
        entry = sums.setdefault(module, [0.0, 0.0, set()])
        entry[0] += cpu
        entry[1] += wall
        entry[2].add(nodeid)
    ranked = sorted(sums.items(), key=lambda item: item[1][0], reverse=True)
    return {module: (cpu, wall, len(tests)) for module, (cpu, wall, tests) in ranked}


_COST = pytest.StashKey[dict]()


def main(argv: list[str]) -> int:
    """`python -m tests.cputime HOST_BEFORE REPORT...`: the sessions' totals added up (scripts/test.sh)."""
    host_before, paths = float(argv[0]), argv[1:]
    reports = [json.loads(Path(path).read_text()) for path in paths if Path(path).exists()]
    cpu = sum(report["cpu_s"] for report in reports)
    wall = max((report["wall_s"] for report in reports), default=0.0)
    host = host_cpu()
    host_text = f"; the whole host: {host - host_before:.0f} CPU-s" if host and host_before else ""
    print(
        f"test.sh: {len(reports)} of {len(paths)} sessions side by side: {wall:.0f} s wall (the longest), "
        f"{cpu:.0f} CPU-s in pytest and the processes it reaped{host_text}"
    )
    return 0 if len(reports) == len(paths) else 1


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
