# track: the study in MLflow (scalestudy.tracking, docs/tracking.md). With `tracking.enabled`, every
# training job's rank 0 streams its run live (the settings reach it through one environment
# variable, never the run config), the points not yet running show as SCHEDULED (onstart), and rule
# `track`, on the submit host, replays every run folder, the smoke tests' results (rules/smoke.smk),
# the collective benchmark's CSVs (rules/comm.smk) and the study's tables, figures and paper into
# the store, adding only what is missing. Off: no rule, no variable, no mlflow import.

from scalestudy import tracking as _tracking

TRACKING = _tracking.settings(config, os.getcwd())
TRACK_LOGS = f"{paths.LOGS_DIR}/tracking"
TRACK_TARGETS = []

if TRACKING:
    # Inherited by every job (local, sbatch --export=ALL) and, as APPTAINERENV_*, inside the image.
    os.environ.update(_tracking.to_environ(TRACKING))
    TRACKING_JSON = json.dumps(TRACKING, sort_keys=True)

    # SCHEDULED runs for the grid's points, before the first job (skipped by dry runs)
    ONSTART_HOOKS.append(lambda: _tracking.schedule_planned(config, TRACKING, logger.warning))

    rule track:
        input:
            summaries=RUN_SUMMARIES,
            smoke=SMOKE_OUTPUTS,
            comm=expand(rules.comm_bench.output[0], world=COMM_WORLDS),
            study=[*ANALYSIS_TARGETS, *FIGURE_TARGETS, *PAPER_TARGETS],
        output:
            f"{TRACK_LOGS}/sync.json",
        params:
            tracking=lambda wildcards: TRACKING_JSON,
        log:
            f"{TRACK_LOGS}/sync.log",
        # On the submit host (cluster.ALWAYS_ON_SUBMIT_HOST), outside the image: it reaches the
        # tracking server (compute nodes may not) and writes the embedded store with the venv's full mlflow.
        resources:
            **light_resources(),
        conda: SOFTWARE_ENV
        shell:
            "python -m scalestudy.tracking sync --tracking-json {params.tracking:q} --runs-dir results/runs"
            " --smoke-files {input.smoke:q} --comm-files {input.comm:q}"
            " --study-files {input.study:q} --optional-files results/report.html --out {output:q} > {log:q} 2>&1"

    TRACK_TARGETS = [rules.track.output[0]]
