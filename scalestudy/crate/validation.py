"""roc-validator on a crate, against every profile the crate declares, offline if need be.

The validator resolves the crate's JSON-LD contexts over HTTP (through its own cache). Where there
is no network (a compute node, CI), `offline=True` serves the two contexts the crate uses from the
package (contexts/README.md: the RO-Crate 1.1 context as published, and the workflow-run terms'
context, which maps each term to its IRI), seeded into a cache of its own.

roc-validator is a test and development dependency (envs/requirements-dev.txt): it is imported
only when a crate is validated.
"""

from __future__ import annotations

import gzip
import importlib.resources
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("scalestudy.crate.validation")

# The profile URIs the crate declares (scalestudy.crate.build.PROFILES) -> roc-validator's names.
PROFILE_NAMES = {
    "https://w3id.org/ro/crate/1.1": "ro-crate-1.1",
    "https://w3id.org/workflowhub/workflow-ro-crate/1.0": "workflow-ro-crate-1.0",
    "https://w3id.org/ro/wfrun/process/0.5": "process-run-crate-0.5",
    "https://w3id.org/ro/wfrun/workflow/0.5": "workflow-run-crate-0.5",
    "https://w3id.org/ro/wfrun/provenance/0.5": "provenance-run-crate-0.5",
}
RO_CRATE_CONTEXT = "https://w3id.org/ro/crate/1.1/context"
WORKFLOW_RUN_CONTEXT = "https://w3id.org/ro/terms/workflow-run/context"
CONTEXTS = (RO_CRATE_CONTEXT, WORKFLOW_RUN_CONTEXT)
ACCEPT = "application/ld+json, application/json, */*;q=0.1"  # what the validator's loader asks for
# The terms of the workflow-run namespace (https://w3id.org/ro/terms/workflow-run#<term>).
WORKFLOW_RUN_TERMS = (
    "ParameterConnection",
    "ContainerImage",
    "DockerImage",
    "SIFImage",
    "connection",
    "sourceParameter",
    "targetParameter",
    "md5",
    "sha1",
    "sha256",
    "sha512",
    "environment",
    "registry",
    "tag",
    "containerImage",
    "resourceUsage",
)


@dataclass
class Report:
    """What the validator said about one profile at one severity."""

    profile: str
    severity: str
    passed: bool
    issues: list[str] = field(default_factory=list)


def context_document(url: str) -> dict:
    """One of the crate's two contexts, without the network."""
    if url == WORKFLOW_RUN_CONTEXT:
        return {
            "@context": {
                term: f"https://w3id.org/ro/terms/workflow-run#{term}" for term in WORKFLOW_RUN_TERMS
            }
        }
    if url != RO_CRATE_CONTEXT:
        raise ValueError(f"no offline copy of the JSON-LD context {url}")
    resource = importlib.resources.files("scalestudy.crate").joinpath(
        "contexts", "ro-crate-1.1-context.jsonld.gz"
    )
    return json.loads(gzip.decompress(resource.read_bytes()))


def network_problem(url: str = RO_CRATE_CONTEXT, timeout_s: float = 3.0) -> str | None:
    """Why the crate's JSON-LD context cannot be fetched now (no network, a proxy refusing, a slow
    answer), in a few words; None where it can."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, headers={"Accept": ACCEPT}, method="HEAD")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s):
            return None
    except urllib.error.HTTPError as error:
        return f"{url} answered HTTP {error.code}"
    except (OSError, ValueError) as error:
        return f"{url} cannot be fetched ({one_line(getattr(error, 'reason', error))})"


def one_line(error: BaseException | object) -> str:
    """An exception as one line: its type and the first line of its message (a validator's failure
    to fetch a context carries a page of HTML or a chained traceback)."""
    text = str(error).strip().splitlines()
    first = text[0][:300] if text else ""
    name = type(error).__name__ if isinstance(error, BaseException) else ""
    return f"{name}: {first}" if name and first else name or first


def seed_cache(cache_path: str | os.PathLike) -> Path:
    """A requests-cache (the validator's backend) holding the crate's contexts under their URLs: each
    fetched once through a session whose transport serves context_document() instead of the network."""
    import io

    import requests
    import urllib3
    from requests_cache import CachedSession

    class Local(requests.adapters.HTTPAdapter):
        def send(self, request, **kwargs):
            body = json.dumps(context_document(request.url)).encode()
            raw = urllib3.HTTPResponse(
                body=io.BytesIO(body),
                headers={"Content-Type": "application/ld+json"},
                status=200,
                preload_content=False,
                request_url=request.url,
            )
            return self.build_response(request, raw)

    session = CachedSession(str(cache_path), backend="sqlite", expire_after=-1, allowable_codes=(200,))
    session.mount("https://", Local())
    for url in CONTEXTS:
        session.get(url, headers={"Accept": ACCEPT}, allow_redirects=True).raise_for_status()
    session.close()
    return Path(cache_path)


def declared_profiles(crate_dir: str | os.PathLike) -> list[str]:
    """roc-validator's names of every profile the crate's root and descriptor conform to."""
    from scalestudy.crate.check import graph

    declared = []
    for entity in graph(Path(crate_dir)):
        if entity.get("@id") in ("./", "ro-crate-metadata.json"):
            values = entity.get("conformsTo") or []
            values = values if isinstance(values, list) else [values]
            declared += [value["@id"] if isinstance(value, dict) else value for value in values]
    unknown = [uri for uri in declared if uri not in PROFILE_NAMES]
    if unknown:
        raise ValueError(f"{crate_dir}: profiles this validation does not know: {unknown}")
    return sorted({PROFILE_NAMES[uri] for uri in declared}, key=list(PROFILE_NAMES.values()).index)


def profiles_to_run(declared: list[str]) -> dict[str, list[str]]:
    """{profile to validate: the declared profiles its validation covers}. roc-validator checks a
    profile's inherited profiles with it, so a declared profile that another declared profile
    inherits is not validated again: for the study's crate, Provenance Run Crate alone covers all
    five (its report is the union of the five's; each took 7 to 8 CPU-s)."""
    from rocrate_validator import services

    inherited = {
        name: {parent.identifier for parent in services.get_profile(name).inherited_profiles}
        for name in declared
    }
    covered_by_another = set().union(*inherited.values())
    return {
        name: [other for other in declared if other == name or other in inherited[name]]
        for name in declared
        if name not in covered_by_another
    }


def validate(
    crate_dir: str | os.PathLike,
    profile: str,
    severity: str = "REQUIRED",
    offline: bool = False,
    cache_path: str | os.PathLike | None = None,
) -> Report:
    """roc-validator's result for one profile at one severity (REQUIRED or RECOMMENDED)."""
    from rocrate_validator import services

    settings = services.ValidationSettings(
        rocrate_uri=str(Path(crate_dir).resolve()),
        profile_identifier=profile,
        requirement_severity=severity,
        offline=offline,
        cache_path=str(cache_path) if cache_path else None,
        enable_profile_inheritance=True,  # what profiles_to_run counts on
    )
    result = services.validate(settings)
    issues = sorted(
        {
            f"{issue.severity.name} [{issue.check.identifier if issue.check else '-'}] {issue.message}"
            + (f" ({issue.violatingEntity})" if getattr(issue, "violatingEntity", None) else "")
            for issue in result.get_issues()
        }
    )
    return Report(profile, severity, result.passed(), issues)
