"""What a person running the demo reads in the console (scripts/demo.sh).

* condense.py: Snakemake's console output shortened as it streams: a finished job is one line
  ("[02:13:51] 58 of 59 steps (98%) done: track"), the job-stats table one line, the scheduler's own
  chatter and the report's "Adding ..." lines left out; warnings, errors and failed jobs' logs pass
  unchanged. Snakemake's whole log stays in .snakemake/log/, each job's command in its own log.
* summary.py: the closing summary: where the report, the paper, the crate and the tables are, the
  headline numbers (from results/tables), and the command and link that open the runs in MLflow.

    ... 2>&1 | python -m scalestudy.console condense
    python -m scalestudy.console summary [--results results] [--seconds S] [--name demo]
"""
