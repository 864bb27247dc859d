# The report's tables and the figures' command lines: a table with its caption, a figure's inputs as
# `--<name> <files>` arguments (the analysis: settings a rule reads are analysis_json's, values.smk).

import shlex
from typing import NamedTuple

from scalestudy.plan import paths

TABLES_DIR = paths.TABLES_DIR


def table_report(name, category, subcategory=None):
    """A table shown in the report, with its caption report/table_<stem>.rst."""
    return report(
        f"{TABLES_DIR}/{name}",
        caption=f"../report/table_{name.rsplit('.', 1)[0]}.rst",
        category=category,
        subcategory=subcategory,
    )


class Figure(NamedTuple):
    category: str  # the report's category
    command: str  # the `python -m scalestudy.plots` subcommand
    inputs: dict  # {option name: file(s)}
    extra: str = ""  # further arguments
    sections: tuple = ()  # the analysis: sections it reads (see analysis_json)


def input_args(names):
    """A params function: `--<name> <files>` for each named input, shell-quoted.

    (A params value rather than a shell template, because the rules below are made in a loop and a
    shell: template would see the loop variables of the last iteration when it runs.)
    """

    def args(wildcards, input):
        parts = []
        for name in names:
            files = getattr(input, name)
            files = [files] if isinstance(files, str) else list(files)
            parts.append(" ".join([f"--{name}", *map(shlex.quote, files)]))
        return " ".join(parts)

    return args
