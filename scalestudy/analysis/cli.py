"""Shared pieces of the analysis command lines: logging level and where the settings come from."""

from __future__ import annotations

import argparse
import logging

from scalestudy import commandline, contract
from scalestudy.analysis import settings
from scalestudy.progress import setup_logging

log = logging.getLogger("scalestudy.analysis")

# What reading a bad input file raises (tableio names the file in the message): said in one line.
BAD_INPUT = (FileNotFoundError, ValueError, KeyError)


def parser(description: str, with_settings: bool = True) -> argparse.ArgumentParser:
    p = commandline.parser(description)
    p.add_argument("--log-level", default="INFO", help="Logging level (default INFO).")
    if with_settings:
        group = p.add_mutually_exclusive_group()
        group.add_argument(
            "--analysis-json", help="The config's analysis: section as JSON (what rules pass)."
        )
        group.add_argument("--config", help="A study config file (YAML); its analysis: section is used.")
    return p


def start(args: argparse.Namespace) -> dict | None:
    """Set up logging; return the analysis settings (defaults filled) if the parser takes them."""
    setup_logging(getattr(logging, str(args.log_level).upper(), logging.INFO))
    if not hasattr(args, "analysis_json"):
        return None
    return settings.load(args.analysis_json, args.config)


def refuse(error: BaseException) -> int:
    """A bad input (one of BAD_INPUT, its message naming the file) as one line, not a traceback;
    the exit status of bad input (nothing was written)."""
    log.error("%s", error.args[0] if error.args else error)
    return contract.EXIT_BAD_CONFIG
