# gate: the checks before the grid (site check, smoke tests) collected in one checkpoint. Training
# rules take it through after_training_gate (rules/common/values.smk): they wait for it the first time, and are
# not re-run when a check runs again later. Its inputs are ancient(): a check run again (new
# settings, a larger world size) does not re-run the gate; a new set of checks does (the site check
# switched on or off, another partition: other hardware), and with it every training job.


checkpoint training_gate:
    input:
        lambda wildcards: [ancient(path) for path in training_gates()],
    output:
        f"{paths.GATES_DIR}/training.ok",
    log:
        f"{paths.LOGS_DIR}/gates/training.log",
    conda:
        SOFTWARE_ENV
    # The checks that passed, one path a line: all there is to record (each check wrote its own result).
    shell:
        "printf '%s\\n' {input:q} > {output:q} 2> {log:q}"
