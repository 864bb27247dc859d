# track: the study in MLflow (scalestudy.tracking, docs/guide/tracking.md). With `tracking.enabled`, every
# training job's rank 0 journals its run in its run folder (the settings reach it through one
# environment variable, never the run config), the study's follower sends the journals to MLflow
# while the jobs run and shows the points not yet running as SCHEDULED (onstart), and rule
# `track`, on the submit host, replays every run folder, the smoke tests' results (rules/smoke.smk),
# the collective benchmark's CSVs (rules/comm.smk) and the study's tables, figures and paper into
# the store, adding only what is missing. Off: no rule, no variable, no mlflow import.

from scalestudy import tracking as _tracking

TRACKING = _tracking.settings(config, os.getcwd())
TRACK_LOGS = f"{paths.LOGS_DIR}/tracking"

if TRACKING:
    # Inherited by every job (local, sbatch --export=ALL) and, as APPTAINERENV_*, inside the image:
    # set before the first job starts.
    on_start(lambda: os.environ.update(_tracking.to_environ(TRACKING)))
    TRACKING_JSON = json.dumps(TRACKING, sort_keys=True)

    # The study's follower (scalestudy.tracking.follow) beside this Snakemake process, from before
    # the first job (not in dry runs) to its end: SCHEDULED runs for the grid's points, then the
    # training jobs' journals into MLflow while they run. Rule track stops it before its replay.
    FOLLOWER_PID = f"{TRACK_LOGS}/{_tracking.FOLLOWER_PID}"
    on_start(
        lambda: _tracking.start_follower(
            TRACKING, TRACK_LOGS, [paths.RUNS_DIR, paths.SMOKE_DIR], _tracking.planned_points(config)
        )
    )
    on_exit(lambda: _tracking.stop_follower(FOLLOWER_PID))

    rule track:
        input:
            summaries=provided("run_summaries"),
            smoke=provided("smoke_results"),
            comm=provided("comm_results"),
            study=provided("analysis", "figures", "paper"),
        output:
            f"{TRACK_LOGS}/sync.json",
        log:
            f"{TRACK_LOGS}/sync.log",
        conda:
            SOFTWARE_ENV
        # On the submit host (cluster.ALWAYS_ON_SUBMIT_HOST), outside the image: it reaches the
        # tracking server (compute nodes may not) and writes the embedded store with the venv's full mlflow.
        resources:
            **light_resources(),
        params:
            tracking=lambda wildcards: TRACKING_JSON,
            follower=FOLLOWER_PID,
        shell:
            "python -m scalestudy.tracking sync --tracking-json {params.tracking:q} --runs-dir results/runs"
            " --smoke-files {input.smoke:q} --comm-files {input.comm:q}"
            " --study-files {input.study:q} --optional-files results/report.html --stop-follower {params.follower:q}"
            " --out {output:q} > {log:q} 2>&1"

    provide("track", rules.track.output)
