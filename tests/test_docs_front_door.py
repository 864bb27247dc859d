"""The README is a front door a newcomer reads in minutes, and the user guide states expectations, not
run logs: the README is at most 160 lines; it shows the cluster route's three steps (config section,
profile, report) within its first 60 lines and links the config reference; neither it nor any guide
page carries a date (a dated measurement belongs in docs/measurements/ or CHANGELOG.md) or an issue
number (the history is CHANGELOG.md's)."""

from __future__ import annotations

import re

from tests.conftest import REPO

README = REPO / "README.md"
GUIDE = sorted((REPO / "docs/guide").glob("*.md"))
DATE = re.compile(r"\b(?:19|20)\d\d-\d\d")
ISSUE = re.compile(r"issue", re.I)


def log_lines(text: str) -> list[str]:
    """The lines of a page that hold a date or the word issue."""
    return [line for line in text.splitlines() if DATE.search(line) or ISSUE.search(line)]


def test_the_readme_is_short():
    assert len(README.read_text().splitlines()) <= 160


def test_the_readme_and_the_guide_hold_no_date_and_no_issue_number():
    assert len(GUIDE) >= 8, "the user guide's pages (docs/guide/*.md) were not found"
    found = {page.name: log_lines(page.read_text()) for page in [README, *GUIDE]}
    assert {page: lines for page, lines in found.items() if lines} == {}


def test_the_cluster_route_is_in_the_readmes_first_60_lines_and_the_config_reference_one_click_away():
    head = "\n".join(README.read_text().splitlines()[:60])
    assert "## On your Slurm cluster" in head
    steps = [
        re.search(rf"\*\*{n}\. {word}\.\*\*", head)
        for n, word in enumerate(["Config", "Profile", "Report"], 1)
    ]
    assert all(steps), "the three steps: Config, Profile, Report"
    assert (
        "`cluster:`" in head and "--profile profiles/slurm" in head and "--report results/report.html" in head
    )
    assert "](docs/reference/config.md)" in head


def test_a_dated_line_or_an_issue_number_is_found():
    assert log_lines("measured 2026-11-28\nfixed in issue 41\nIssues left\nplain words\n") == [
        "measured 2026-11-28",
        "fixed in issue 41",
        "Issues left",
    ]
