# paper: LaTeX (booktabs) tables under results/paper/; the figures' PDFs are written by plots.smk
# to results/paper/figures/.

import os

PAPER_DIR = "results/paper"
PAPER_TABLES = ("efficiency", "sensitivity", "acceptance", "resource_estimate", "comm_model")


rule paper_tables:
    input:
        image=image_input(),
        scaling=rules.table_metrics.output.scaling,
        sensitivity=rules.table_metrics.output.sensitivity,
        acceptance=rules.table_acceptance.output.csv,
        resources=rules.table_resources.output.csv,
        comm_fit=rules.table_comm_model.output.fit,
    output:
        **{name: f"{PAPER_DIR}/{name}.tex" for name in PAPER_TABLES},
    params:
        out_dir=lambda wildcards, output: os.path.dirname(output.efficiency),
    log:
        "results/logs/paper/tables.log",
    localrule: on_submit_host("paper_tables")
    resources:
        **light_resources(),
    conda: SOFTWARE_ENV
    container: container_image()
    shell:
        "python -m scalestudy.paper --scaling {input.scaling:q} --sensitivity {input.sensitivity:q}"
        " --acceptance {input.acceptance:q} --resources {input.resources:q} --comm-fit {input.comm_fit:q}"
        " --out-dir {params.out_dir:q} > {log:q} 2>&1"


PAPER_TARGETS = [
    *rules.paper_tables.output,
    *[path for path in FIGURE_TARGETS if path.endswith(".pdf")],
]
