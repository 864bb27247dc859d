# crate: the study as a Workflow Run RO-Crate (Provenance Run Crate 0.5; scalestudy/crate): results/crate/
# and results/crate.zip. Its inputs are every output of the study, so it is written again whenever the
# study changes. It reads Snakemake's metadata (.snakemake/metadata) for every job that made them, on
# the submit host (cluster.ALWAYS_ON_SUBMIT_HOST), outside the image: rocrate is the venv's. Its
# JSON (the whole config, every rule's patterns) goes in files (scalestudy.commandline.json_file),
# not on its command line. When a run starts, the run's jobs are recorded (record_run_jobs), so that
# the crate also lists the jobs its outputs do not stand on: its own, and those beside and after it.

import glob

import scalestudy.commandline as _commandline
import scalestudy.crate as _crate

CRATE = config["crate"]
# The workflow's own files, carried in the crate (the main workflow, its rules, its pins).
CRATE_SOURCES = sorted(
    [
        "Snakefile",
        *glob.glob("rules/**/*.smk", recursive=True),
        "envs/requirements.txt",
        "envs/scalestudy.yaml",
    ]
)


CRATE_STUDY = {
    "name": config["study"]["name"],
    "title": config["study"]["title"],
    "license": CRATE["license"],
    "author": CRATE["author"],
    "url": CRATE["url"],
}


if CRATE["enabled"]:
    on_start(lambda: _crate.record_run_jobs(workflow.dag.needrun_jobs(), workflow.local_exec))

    rule crate:
        input:
            study=provided("run_summaries", "profile", "analysis", "figures", "paper", "compare"),
            gate=rules.training_gate.output,
            sources=CRATE_SOURCES,
        output:
            folder=directory(paths.CRATE_DIR),
            zip=f"{paths.CRATE_DIR}.zip",
        log:
            f"{paths.LOGS_DIR}/crate.log",
        conda:
            SOFTWARE_ENV
        resources:
            **light_resources(),
        params:
            # "@FILE"s named by their content (a changed value: a changed parameter); functions,
            # never formatted for wildcards (a config value may hold braces)
            rules=lambda wildcards: _commandline.json_file(
                _crate.rule_specs(workflow.rules, workflow.basedir), "crate-rules"
            ),
            config=lambda wildcards: _commandline.json_file(config, "config"),
            study=lambda wildcards: _commandline.json_file(CRATE_STUDY, "crate-study"),
            config_files=lambda wildcards: [os.path.relpath(path) for path in workflow.configfiles],
            exclude=lambda wildcards: ["--exclude", *CRATE["exclude"]] if CRATE["exclude"] else [],
            metadata=lambda wildcards: os.path.join(os.path.relpath(workflow.persistence.path), "metadata"),
        shell:
            "python -m scalestudy.crate write --out-dir {output.folder:q} --zip {output.zip:q}"
            " --metadata-dir {params.metadata:q} --targets {input.study:q} {input.gate:q} --rules-json {params.rules:q}"
            " --sources {input.sources:q} --config-files {params.config_files:q}"
            " --config-json {params.config:q} --study-json {params.study:q} {params.exclude:q} > {log:q} 2>&1"

    provide("crate", rules.crate.output)
