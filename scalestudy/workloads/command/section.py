"""The run config's `command` section (the config's workload.command, copied by the grid): checked
and filled in by scalestudy.plan.runconfig.validate for the runner (scalestudy.workloads.command).
Standard library only."""

from __future__ import annotations

from typing import Any

from scalestudy.workloads.command.spec import SPEC

COMMAND_KEYS = ("script", "args", "sample_unit")


def problems(command: Any) -> list[str]:
    if not isinstance(command, dict):
        return [f"command must be an object with {', '.join(COMMAND_KEYS)}, got {command!r}"]
    found = []
    if not (isinstance(command.get("script"), str) and command["script"]):
        found.append(f"command.script={command.get('script')!r} must be a non-empty string (a path)")
    args = command.get("args", [])
    if not (isinstance(args, list) and all(isinstance(arg, str) for arg in args)):
        found.append(f"command.args={args!r} must be a list of strings")
    unit = command.get("sample_unit", SPEC.sample_unit)
    if not (isinstance(unit, str) and unit):
        found.append(f"command.sample_unit={unit!r} must be a non-empty string")
    return found + [f"command.{key} is not a known key" for key in set(command) - set(COMMAND_KEYS)]


def filled(command: dict[str, Any]) -> dict[str, Any]:
    """The section with its defaults: what the runner reads."""
    return {"args": [], "sample_unit": SPEC.sample_unit, **command}
