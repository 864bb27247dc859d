# paper: the draft of the paper, re-written whenever the study changes. booktabs tables (paper_tables),
# every number of the text as a LaTeX macro (paper_numbers -> numbers.tex), paper.tex from the template
# in report/paper/ (paper_draft, which checks that every macro is defined and no number is typed by
# hand) and paper.pdf (paper_pdf, latexmk). The figures' PDFs are written by plots.smk and profile.smk
# to results/paper/figures/.

import os
import shutil

from snakemake.logging import logger

PAPER_DIR = paths.PAPER_DIR
PAPER_LOGS = f"{paths.LOGS_DIR}/paper"
PAPER_TABLES = ("efficiency", "sensitivity", "acceptance", "resource_estimate", "comm_model")
PAPER = config["paper"]

# The tables the paper's numbers come from: {name: file}; names are scalestudy.paper.numbers.TABLES.
# A table not listed reads "not measured" in the paper; to add one, add one line, e.g.
#   "system": rules.system_table.output.csv,
PAPER_DATA = {
    "runs": rules.table_runs.output.runs,
    "scaling": rules.table_metrics.output.scaling,
    "sensitivity": rules.table_metrics.output.sensitivity,
    "acceptance": rules.table_acceptance.output.csv,
    "resources": rules.table_resources.output.csv,
    "comm_fit": rules.table_comm_model.output.fit,
    "comm_prediction": rules.table_comm_model.output.prediction,
    "profile_breakdown": rules.profile_combine.output.breakdown,
    "profile_overlap": rules.profile_combine.output.overlap,
    "system": rules.table_system.output[0],
    "comm_bench_fit": rules.table_comm_bench.output.fit,
    "waterfall": rules.table_waterfall.output.csv,
    **({"comparison": paths.COMPARISON_TABLE} if config["compare"]["against"] else {}),
}
# What the paper says that no table records (a params value: changing one re-writes only the paper).
PAPER_CONTEXT = {
    "title": config["study"]["title"] or config["study"]["name"],
    "data_source": config["data"]["source"],
    "device": config["train"]["device"],
    "confidence": config["analysis"]["confidence"],
    "workload": WORKLOAD.name,
    "sample_unit": WORKLOAD.sample_unit,
    "parallelism": list(config["scaling"].get("parallelism") or ["ddp"]),
    "sensitivity_axes": SENSITIVITY_AXES,
    "compared_with": compared_label() or "",
    "min_window_samples": config["analysis"]["monitor"]["min_window_samples"],
}
# The figures' vector PDFs (rules/plots.smk, rules/profile.smk)
PAPER_FIGURES = provided(
    "figures", "profile", keep=lambda path: path.startswith(f"{paths.PAPER_FIGURES_DIR}/")
)

# The PDF needs TeX on the host that runs this workflow (it is not in the training image). paper.pdf:
# "auto" builds it where latexmk is on PATH and otherwise leaves it out of `all`, saying so here;
# "always" asks for it (a clear error without TeX); "never" leaves it out. Asking for the file by
# name (snakemake results/paper/paper.pdf) always tries.
PAPER_PDF = PAPER["pdf"] == "always" or (PAPER["pdf"] == "auto" and shutil.which("latexmk") is not None)
if PAPER["pdf"] == "auto" and not PAPER_PDF:
    logger.info(
        f"paper: latexmk not found, so {PAPER_DIR}/paper.pdf is skipped (paper.tex is still written); "
        "install TeX Live (Debian: tests/tex/install.sh) to build it."
    )


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
    log:
        f"{PAPER_LOGS}/tables.log",
    conda:
        SOFTWARE_ENV
    container:
        container_image()
    resources:
        **light_resources(),
    params:
        out_dir=lambda wildcards, output: os.path.dirname(output.efficiency),
        unit=PLOT_UNIT,
        axes=SENSITIVITY_AXES,
    shell:
        "python -m scalestudy.paper --scaling {input.scaling:q} --sensitivity {input.sensitivity:q}"
        " --acceptance {input.acceptance:q} --resources {input.resources:q} --comm-fit {input.comm_fit:q}"
        " --out-dir {params.out_dir:q} --unit {params.unit:q} --sensitivity-axes {params.axes:q} > {log:q} 2>&1"


rule paper_numbers:
    input:
        **PAPER_DATA,
        image=image_input(),
    output:
        f"{PAPER_DIR}/numbers.tex",
    log:
        f"{PAPER_LOGS}/numbers.log",
    conda:
        SOFTWARE_ENV
    container:
        container_image()
    resources:
        **light_resources(),
    params:
        tables=lambda wildcards, input: [f"{name}={getattr(input, name)}" for name in PAPER_DATA],
        context=lambda wc: json.dumps(PAPER_CONTEXT, sort_keys=True),  # a function: never formatted
    shell:
        "python -m scalestudy.paper.numbers --table {params.tables:q}"
        " --context-json {params.context:q} --out {output:q} > {log:q} 2>&1"


rule paper_draft:
    input:
        template=PAPER["template"],
        bib=PAPER["bibliography"],
        numbers=rules.paper_numbers.output[0],
        tables=rules.paper_tables.output,
        figures=PAPER_FIGURES,
        image=image_input(),
    output:
        tex=f"{PAPER_DIR}/paper.tex",
        bib=f"{PAPER_DIR}/references.bib",
    log:
        f"{PAPER_LOGS}/draft.log",
    conda:
        SOFTWARE_ENV
    container:
        container_image()
    resources:
        **light_resources(),
    shell:
        "python -m scalestudy.paper.draft --template {input.template:q} --bib {input.bib:q}"
        " --numbers {input.numbers:q} --out {output.tex:q} --bib-out {output.bib:q} > {log:q} 2>&1"


rule paper_pdf:
    input:
        **rules.paper_draft.output,
        numbers=rules.paper_numbers.output[0],
        tables=rules.paper_tables.output,
        figures=PAPER_FIGURES,
    output:
        f"{PAPER_DIR}/paper.pdf",
    log:
        f"{PAPER_LOGS}/pdf.log",
    conda:
        SOFTWARE_ENV
    # On the host, outside the container: TeX is a host tool (the training image has none).
    resources:
        **light_resources(),
    shell:
        "python -m scalestudy.paper.build --tex {input.tex:q} --pdf {output:q} > {log:q} 2>&1"


provide(
    "paper",
    [
        *rules.paper_tables.output,
        *rules.paper_numbers.output,
        *rules.paper_draft.output,
        *(rules.paper_pdf.output if PAPER_PDF else []),
    ],
)
