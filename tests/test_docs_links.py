"""Every link of the Markdown pages resolves, and every page the code sends a reader to exists.

- Each relative link or image of every Markdown file of the checkout (README.md, CONTRIBUTING.md,
  docs/**/*.md, config/README.md, ...; git's tracked and new files) names a file or folder that
  exists; a `#fragment` into a Markdown page names one of its headings, as GitHub makes their
  anchors (lower case, punctuation dropped, blanks to `-`, a repeated heading `-1`, `-2`, ...).
- Each `docs/<page>.md` the code, the rules, the configs and the scripts name exists, and where
  the reference quotes a section (`docs/guide/cluster.md, "Site check"`) the page has those words.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests.conftest import REPO

LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s*(```+|~~~+)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)
# A docs page named in code, with the section it quotes, if any: docs/x.md, "Section" / 'Section'
CODE_REFERENCE = re.compile(r"(docs/[\w./-]+?\.md)(?:,? [\"']([^\"'\n]{3,60})[\"'])?")
CODE_SUFFIXES = {".py", ".smk", ".yaml", ".yml", ".sh", ".sbatch", ".def", ".toml", ".cff", ".txt", ""}
# Pages the tests themselves write (not in the checkout)
WRITTEN_BY_TESTS = {"tests/test_docs_commands.py", "tests/test_docs_links.py"}


def checkout_files(root: Path = REPO) -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        check=True,
    )
    names = set(listed.stdout.decode().split("\0"))
    return sorted(name for name in names if name and (root / name).is_file())


def outside_code(text: str) -> list[tuple[int, str]]:
    """(line number, line) of a Markdown text outside fenced code blocks, inline code blanked out."""
    lines, fence = [], None
    for number, line in enumerate(text.splitlines(), 1):
        opened = FENCE.match(line)
        if fence:
            if opened and opened.group(1)[0] == fence[0] and len(opened.group(1)) >= len(fence):
                fence = None
            continue
        if opened:
            fence = opened.group(1)
            continue
        lines.append((number, re.sub(r"(`+)(?:(?!\1).)+?\1", lambda m: " " * len(m.group(0)), line)))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: its text (links and code unwrapped), lower case, only letters,
    digits, `-`, `_` and blanks kept, blanks made `-`."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").lower()
    text = "".join(char for char in text if char.isalnum() or char in " -_")
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    found: set[str] = set()
    counts: dict[str, int] = {}
    for _, line in outside_code_keep_inline(text):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = counts.get(base, 0)
        counts[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def outside_code_keep_inline(text: str) -> list[tuple[int, str]]:
    """Like outside_code, but inline code kept (headings keep their `code` words in their anchors)."""
    kept = dict(enumerate(text.splitlines(), 1))
    return [(number, kept[number]) for number, _ in outside_code(text)]


def broken_links(root: Path, pages: list[str]) -> list[str]:
    problems = []
    for page in pages:
        path = root / page
        text = path.read_text(encoding="utf-8")
        for number, line in outside_code(text):
            for target in LINK.findall(line):
                if SCHEME.match(target) or target.startswith("//"):
                    continue
                problem = check_target(root, path, target)
                if problem:
                    problems.append(f"{page}:{number}: ({target}) {problem}")
    return problems


def check_target(root: Path, page: Path, target: str) -> str | None:
    name, _, fragment = target.partition("#")
    resolved = (page.parent / name).resolve() if name else page
    if root.resolve() not in [resolved, *resolved.parents]:
        return "leads outside the repository"
    if not resolved.exists():
        return "does not exist"
    headings = anchors(resolved.read_text(encoding="utf-8")) if resolved.suffix == ".md" else set()
    if fragment and resolved.suffix == ".md" and fragment not in headings:
        return f"has no heading whose anchor is #{fragment}"
    return None


def test_every_relative_link_of_every_page_resolves():
    pages = [name for name in checkout_files() if name.endswith(".md")]
    assert {"README.md", "CONTRIBUTING.md", "docs/reference/config.md"} <= set(pages)
    problems = broken_links(REPO, pages)
    assert not problems, "links that lead nowhere:\n" + "\n".join(problems)


def test_every_docs_page_the_code_names_exists_with_the_section_it_quotes():
    problems, seen = [], 0
    for name in checkout_files():
        path = REPO / name
        if name.startswith("docs/") or name in WRITTEN_BY_TESTS or path.suffix not in CODE_SUFFIXES:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for page, section in CODE_REFERENCE.findall(text):
            seen += 1
            target = REPO / page
            if not target.is_file():
                problems.append(f"{name}: {page} does not exist")
            elif section and section not in target.read_text(encoding="utf-8"):
                problems.append(f"{name}: {page} has no {section!r}")
    assert seen > 50, "the code names no docs page: the pattern is broken"
    assert not problems, "\n".join(sorted(set(problems)))


def test_a_broken_link_or_anchor_is_named_with_its_page_and_line(tmp_path):
    (tmp_path / "docs").mkdir()
    heading = "## Its `code` heading: yes!\n\n"
    (tmp_path / "docs/a.md").write_text(f"# A page\n\n{heading}{heading}```\n[not a link](nowhere.md)\n```\n")
    (tmp_path / "README.md").write_text(
        "See [a](docs/a.md#its-code-heading-yes), [again](docs/a.md#its-code-heading-yes-1),\n"
        "[gone](docs/b.md), [bad anchor](docs/a.md#nope), ![img](docs/), [web](https://x.org/y.md),\n"
        "`[code](nowhere.md)` and [here](#a-readme).\n\n# A README\n"
    )
    assert broken_links(tmp_path, ["README.md", "docs/a.md"]) == [
        "README.md:2: (docs/b.md) does not exist",
        "README.md:2: (docs/a.md#nope) has no heading whose anchor is #nope",
    ]


def test_anchors_follow_githubs_rules():
    assert slug("5. The image") == "5-the-image"
    assert slug("The `gpu` resource") == "the-gpu-resource"
    assert slug("GPU: measured on one H100 (2026-11-26)") == "gpu-measured-on-one-h100-2026-11-26"
    assert slug("Comparing two studies (scalestudy/compare/, rules/compare.smk)") == (
        "comparing-two-studies-scalestudycompare-rulescomparesmk"
    )
