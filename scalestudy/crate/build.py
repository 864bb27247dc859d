"""The study as a Provenance Run Crate (Workflow Run RO-Crate 0.5 family, RO-Crate 1.1), with rocrate.

What the crate holds (docs/guide/compare-and-crate.md, "The crate"):

* the Snakefile as the main workflow (File, SoftwareSourceCode, ComputationalWorkflow, HowTo), the
  rule files, and the config: the files the run used and the effective config (config.json, its
  hash as a PropertyValue), the run's input (a FormalParameter of the workflow);
* one CreateAction per job (scalestudy.crate.jobs): the rule (a SoftwareApplication the workflow
  hasPart) as instrument, start and end, actionStatus, inputs and outputs, the container image with
  its sha256, the Slurm job ids and nodes, resource usage (wall time, CPU time, peak RSS, GPU-hours,
  attempts, energy: "not measured" where no measurement wrote energy_j), and a ControlAction per job
  pointing at the rule's HowToStep; an OrganizeAction for Snakemake itself;
* every output file with its sha256 and size; the figures and tables name what they were drawn
  from (isBasedOn) and the jobs behind them (description);
* the software versions the runs recorded, as SoftwareApplications the rules require.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from rocrate.model.contextentity import ContextEntity
from rocrate.rocrate import ROCrate

from scalestudy.crate import jobs as jobinfo
from scalestudy.crate import lineage
from scalestudy.crate.payload import Payload
from scalestudy.plan.runfiles import NOT_MEASURED

RO_CRATE_VERSION = "1.1"
WFRUN_CONTEXT = "https://w3id.org/ro/terms/workflow-run/context"
WFRUN = "https://w3id.org/ro/terms/workflow-run#"
PROFILES = {
    "https://w3id.org/ro/wfrun/process/0.5": "Process Run Crate",
    "https://w3id.org/ro/wfrun/workflow/0.5": "Workflow Run Crate",
    "https://w3id.org/ro/wfrun/provenance/0.5": "Provenance Run Crate",
    "https://w3id.org/workflowhub/workflow-ro-crate/1.0": "Workflow RO-Crate",
}
COMPLETED, FAILED = "http://schema.org/CompletedActionStatus", "http://schema.org/FailedActionStatus"
ACTIVE, POTENTIAL = "http://schema.org/ActiveActionStatus", "http://schema.org/PotentialActionStatus"
UNITS = {  # QUDT units of the resource usage
    "s": "https://qudt.org/vocab/unit/SEC",
    "h": "https://qudt.org/vocab/unit/HR",
    "MB": "https://qudt.org/vocab/unit/MegaBYTE",
    "J": "https://qudt.org/vocab/unit/J",
    "1": "https://qudt.org/vocab/unit/NUM",
}
SNAKEMAKE_URL = "https://snakemake.github.io"
MAIN_WORKFLOW = "Snakefile"
BIOSCHEMAS_WORKFLOW = "https://bioschemas.org/profiles/ComputationalWorkflow/1.0-RELEASE"
DESCRIPTOR_PROFILES = ("https://w3id.org/ro/crate/1.1", "https://w3id.org/workflowhub/workflow-ro-crate/1.0")
# Where a recorded package's release is described (python packages: PyPI).
SOFTWARE_URLS = {
    "python": "https://www.python.org/downloads/",
    "cuda": "https://developer.nvidia.com/cuda-toolkit",
    "cudnn": "https://developer.nvidia.com/cudnn",
    "nccl": "https://developer.nvidia.com/nccl",
}


def ref(entity_or_id) -> dict[str, str]:
    return {"@id": entity_or_id if isinstance(entity_or_id, str) else entity_or_id.id}


class CrateBuilder:
    """One crate: files first (add_files), then the workflow and its jobs (add_run)."""

    def __init__(self, study: Mapping[str, Any]):
        self.study = study
        self.crate = ROCrate(version=RO_CRATE_VERSION)
        self.crate.metadata.extra_contexts.append(WFRUN_CONTEXT)
        self.crate.metadata["conformsTo"] = [{"@id": uri} for uri in DESCRIPTOR_PROFILES]
        self.files: dict[str, Any] = {}  # path -> File entity (or the description of an excluded file)
        self.software: dict[tuple[str, str], Any] = {}
        self._root()

    # ------------------------------------------------------------------ root and files

    def _root(self) -> None:
        root = self.crate.root_dataset
        root["name"] = self.study["name"]
        root["description"] = self.study["description"]
        root["license"] = self._license(self.study["license"])
        root["datePublished"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        for url, name in PROFILES.items():
            profile = self.crate.add(
                ContextEntity(self.crate, url, {"@type": "CreativeWork", "name": name, "version": url[-3:]})
            )
            root.append_to("conformsTo", profile)
        if self.study.get("author"):
            author = self.crate.add(
                ContextEntity(self.crate, "#author", {"@type": "Person", "name": self.study["author"]})
            )
            root["author"] = author

    def _license(self, name: str):
        """The licence as a contextual entity: an SPDX identifier becomes its spdx.org URL."""
        url = name if "://" in name else f"https://spdx.org/licenses/{name}"
        return self.crate.add(
            ContextEntity(self.crate, url, {"@type": "CreativeWork", "name": name, "identifier": name})
        )

    def compact(self) -> None:
        """A property with one value holds it, not a one-element list (RO-Crate 1.1's JSON-LD form)."""
        for entity in self.crate.get_entities():
            for key, value in list(entity._jsonld.items()):
                if isinstance(value, list) and len(value) == 1 and key != "@type":
                    entity._jsonld[key] = value[0]

    def add_files(self, files: Iterable[Payload], crate_dir: Path) -> None:
        """Every payload file: a File entity of the carried ones (the bytes are already in crate_dir),
        a described CreativeWork for an excluded one."""
        for payload in files:
            properties = {
                "name": payload.path,
                "sha256": payload.sha256,
                "contentSize": str(payload.size),
                "encodingFormat": payload.media_type,
            }
            if payload.path == MAIN_WORKFLOW:
                properties["@type"] = ["File", "SoftwareSourceCode", "ComputationalWorkflow", "HowTo"]
            if payload.carried:
                entity = self.crate.add_file(crate_dir / payload.path, payload.path, properties=properties)
            else:
                properties |= {"@type": "CreativeWork", "description": "not carried (crate.exclude)"}
                entity = self.crate.add(ContextEntity(self.crate, f"#excluded/{payload.path}", properties))
            self.files[payload.path] = entity

    def file_refs(self, paths: Iterable[str]) -> list[dict[str, str]]:
        return [ref(self.files[path]) for path in paths if path in self.files]

    # ------------------------------------------------------------------ workflow and jobs

    def add_run(
        self,
        study_jobs: list[jobinfo.Job],
        rule_files: Mapping[str, str],
        config_files: list[str],
        targets: list[str],
        versions: Mapping[str, Any],
    ) -> None:
        workflow = self._workflow(config_files)
        engine = self.crate.add(
            ContextEntity(
                self.crate,
                "#engine-snakemake",
                {
                    "@type": "SoftwareApplication",
                    "name": "Snakemake",
                    "softwareVersion": str(versions.get("snakemake") or jobinfo.NOT_RECORDED),
                    "url": SNAKEMAKE_URL,
                },
            )
        )
        rules = sorted({job.rule for job in study_jobs}, key=[job.rule for job in study_jobs].index)
        tools = {
            rule: self._tool(workflow, rule, position, rule_files) for position, rule in enumerate(rules)
        }
        # the versions a rule's runs recorded (training runs), else those of the process writing the crate
        required: dict[str, dict[str, dict]] = {rule: {} for rule in rules}
        controls = []
        for job in study_jobs:
            action = self._job_action(job, tools[job.rule][0])
            required[job.rule].update({r["@id"]: r for r in self._versions(job.provenance.get("versions"))})
            controls.append(self._control(job, action, tools[job.rule][1]))
        own_versions = self._versions(versions)
        for rule, (tool, _) in tools.items():
            tool["softwareRequirements"] = list(required[rule].values()) or own_versions
        run = self._workflow_run(workflow, study_jobs, config_files, targets)
        organize = {
            "@type": "OrganizeAction",
            "name": "Run of Snakemake",
            "instrument": ref(engine),
            "result": ref(run),
            "object": [ref(c) for c in controls],
            "actionStatus": ACTIVE if any(job.state for job in study_jobs) else COMPLETED,
        }
        if run.get("startTime"):
            organize["startTime"] = run["startTime"]
        self.crate.add(ContextEntity(self.crate, "#organize-snakemake", organize))
        lineage.describe_products(self.files, self.file_refs, study_jobs)

    def _workflow(self, config_files: list[str]):
        workflow = self.files[MAIN_WORKFLOW]
        lang = self.crate.add(
            ContextEntity(
                self.crate,
                "https://w3id.org/workflowhub/workflow-ro-crate#snakemake",
                {
                    "@type": "ComputerLanguage",
                    "name": "Snakemake",
                    "identifier": {"@id": "https://doi.org/10.1093/bioinformatics/bts480"},
                    "url": {"@id": "https://snakemake.readthedocs.io"},
                },
            )
        )
        workflow["programmingLanguage"] = lang
        workflow["version"] = self.study["version"]
        workflow["url"] = self.study.get("url") or SNAKEMAKE_URL
        workflow["conformsTo"] = {"@id": BIOSCHEMAS_WORKFLOW}
        self.crate.root_dataset["mainEntity"] = workflow
        parameter = self.crate.add(
            ContextEntity(
                self.crate,
                "#param-config",
                {
                    "@type": "FormalParameter",
                    "name": "config",
                    "additionalType": "File",
                    "description": "The study's config (config/*.yaml, validated against the schema)",
                },
            )
        )
        workflow["input"] = [ref(parameter)]
        for path in config_files:
            self.files[path].append_to("exampleOfWork", parameter)
        return workflow

    def _tool(self, workflow, rule: str, position: int, rule_files: Mapping[str, str]):
        source = rule_files.get(rule)
        tool = self.crate.add(
            ContextEntity(
                self.crate,
                f"#rule-{rule}",
                {
                    "@type": "SoftwareApplication",
                    "name": f"rule {rule}",
                    "description": f"Snakemake rule {rule}" + (f" ({source})" if source else ""),
                    "softwareVersion": self.study["version"],
                    **({"url": ref(self.files[source])} if source in self.files else {}),
                },
            )
        )
        step = self.crate.add(
            ContextEntity(
                self.crate,
                f"#step-{rule}",
                {"@type": "HowToStep", "name": rule, "position": str(position), "workExample": ref(tool)},
            )
        )
        workflow.append_to("hasPart", tool)
        workflow.append_to("step", step)
        return tool, step

    def _versions(self, versions: Mapping[str, Any] | None) -> list[dict[str, str]]:
        refs = []
        for name, version in sorted((versions or {}).items()):
            if version in (None, ""):
                continue
            key = (name, str(version))
            if key not in self.software:
                self.software[key] = self.crate.add(
                    ContextEntity(
                        self.crate,
                        f"#software-{name}-{version}",
                        {
                            "@type": "SoftwareApplication",
                            "name": name,
                            "softwareVersion": str(version),
                            "url": software_url(name, str(version)),
                        },
                    )
                )
            refs.append(ref(self.software[key]))
        return refs

    def _job_action(self, job: jobinfo.Job, tool):
        image, sha256 = job.image()
        properties = {
            "@type": "CreateAction",
            "name": f"Run of {job.key}",
            "description": job_description(job),
            "instrument": ref(tool),
            "object": self.file_refs(job.inputs),
            "result": self.file_refs([*job.outputs, *job.logs, *jobinfo.kept_attempt_logs(job.logs)]),
            "actionStatus": _status(job),
            "resourceUsage": [ref(v) for v in self._usage(job)],
            "identifier": [ref(v) for v in self._slurm_ids(job)],
        }
        if job.state == jobinfo.WRITING_THE_CRATE:
            properties["result"] = [ref("./")]  # this crate: its folder and zip, hashed by nothing in it
        if job.start:
            properties["startTime"] = jobinfo.iso_time(job.start)
        if job.end:
            properties["endTime"] = jobinfo.iso_time(job.end)
        if job.nodes():
            properties["location"] = job.nodes()
        if image:
            properties["containerImage"] = ref(self._image(image, sha256))
        if self.study.get("author"):
            properties["agent"] = ref("#author")
        action = self.crate.add(ContextEntity(self.crate, f"#job-{job.key}", properties))
        self.crate.root_dataset.append_to("mentions", action)
        return action

    def _usage(self, job: jobinfo.Job) -> list:
        values = [
            ("wall_time_s", job.benchmark.get("s"), "s", "wall time (Snakemake benchmark)"),
            ("cpu_time_s", job.benchmark.get("cpu_time"), "s", "CPU time (Snakemake benchmark)"),
            ("max_rss_mb", job.benchmark.get("max_rss"), "MB", "peak resident memory (Snakemake benchmark)"),
            ("gpu_hours", job.gpu_hours(), "h", "GPUs (ranks on CPUs) x hours of the run, as runs.csv"),
            ("attempts", job.attempts, "1", "attempts that made the outputs (1: a rule never retried)"),
            ("energy_j", job.energy_j(), "J", "energy measured by the run"),
        ]
        entities = []
        for key, value, unit, description in values:
            if value is None and key not in ("energy_j", "attempts"):
                continue  # a job without a benchmark, or one that trained nothing, has none of these
            if value is None:
                value = NOT_MEASURED if key == "energy_j" else jobinfo.NOT_RECORDED
            properties = {
                "@type": "PropertyValue",
                "propertyID": key,
                "name": key,
                "value": value,
                "unitCode": UNITS[unit],
                "description": description,
            }
            entities.append(self.crate.add(ContextEntity(self.crate, f"#usage-{job.key}-{key}", properties)))
        return entities

    def _slurm_ids(self, job: jobinfo.Job) -> list:
        return [
            self.crate.add(
                ContextEntity(
                    self.crate,
                    f"#slurm-job-{job_id}",
                    {
                        "@type": "PropertyValue",
                        "propertyID": "slurm_job_id",
                        "name": "Slurm job",
                        "value": job_id,
                    },
                )
            )
            for job_id in job.slurm_job_ids()
        ]

    def _image(self, image: str, sha256: str | None):
        identifier = f"#image-{sha256 or Path(image).name}"
        existing = self.crate.get(identifier)
        if existing is not None:
            return existing
        properties = {
            "@type": "ContainerImage",
            "additionalType": {"@id": f"{WFRUN}SIFImage"},
            "name": image,
            "sha256": sha256 or jobinfo.NOT_RECORDED,
        }
        return self.crate.add(ContextEntity(self.crate, identifier, properties))

    def _control(self, job: jobinfo.Job, action, step):
        return self.crate.add(
            ContextEntity(
                self.crate,
                f"#control-{job.key}",
                {
                    "@type": "ControlAction",
                    "name": f"orchestrate {job.key}",
                    "instrument": ref(step),
                    "object": ref(action),
                    "actionStatus": _status(job),
                },
            )
        )

    def _workflow_run(self, workflow, study_jobs: list[jobinfo.Job], config_files: list[str], targets):
        config_hash = self.crate.add(
            ContextEntity(
                self.crate,
                "#config-hash",
                {
                    "@type": "PropertyValue",
                    "propertyID": "config_hash",
                    "name": "config hash (scalestudy.provenance.config_hash)",
                    "value": self.study["config_hash"],
                },
            )
        )
        starts = [job.start for job in study_jobs if job.start]
        ends = [job.end for job in study_jobs if job.end]
        properties = {
            "@type": "CreateAction",
            "name": f"Run of the study {self.study['name']}",
            "description": f"The scaling study {self.study['name']}: {len({j.key for j in study_jobs})} jobs",
            "instrument": ref(workflow),
            "object": [*self.file_refs(config_files), ref(config_hash)],
            "result": self.file_refs(targets),
            "actionStatus": FAILED if any(job.incomplete for job in study_jobs) else COMPLETED,
        }
        if any(job.state for job in study_jobs):
            properties["actionStatus"] = ACTIVE  # the crate's own job, and those after it, still to end
        if starts:
            properties["startTime"] = jobinfo.iso_time(min(starts))
        if ends:
            properties["endTime"] = jobinfo.iso_time(max(ends))
        if self.study.get("author"):
            properties["agent"] = ref("#author")
        run = self.crate.add(ContextEntity(self.crate, "#study-run", properties))
        self.crate.root_dataset.append_to("mentions", run)
        return run


def _status(job: jobinfo.Job) -> str:
    """A job's actionStatus: its record's (failed where left incomplete), or its state in the run."""
    if job.state == jobinfo.WRITING_THE_CRATE:
        return ACTIVE
    if job.state:
        return POTENTIAL
    return FAILED if job.incomplete else COMPLETED


def software_url(name: str, version: str) -> str:
    template = SOFTWARE_URLS.get(name, "https://pypi.org/project/{name}/{plain}/")
    return template.format(name=name, plain=version.split("+")[0])


def job_description(job: jobinfo.Job) -> str:
    """What a job's entity says in words: rule, wildcards, Slurm, nodes, attempts, image, energy."""
    image, sha256 = job.image()
    energy = job.energy_j()
    parts = [
        f"rule {job.rule}",
        "wildcards " + (", ".join(f"{k}={v}" for k, v in sorted(job.wildcards.items())) or "none"),
        "Slurm job " + (", ".join(job.slurm_job_ids()) or "none (run by the local executor)"),
        f"nodes {job.nodes() or jobinfo.NOT_RECORDED}" + (" (local executor)" if job.local_host else ""),
        f"attempts {job.attempts or jobinfo.NOT_RECORDED}",
        f"image {image} (sha256 {sha256 or jobinfo.NOT_RECORDED})" if image else "no container image",
        f"energy {energy:.6g} J" if energy is not None else f"energy {NOT_MEASURED}",
    ]
    if job.incomplete:
        parts.append("left incomplete by Snakemake")
    if job.state:
        parts.append(job.state)
    return "; ".join(parts)
