# compare: this study against another (compare.against: its results/ folder or its crate), point by point,
# after aggregation (scalestudy/compare): results/tables/comparison.csv and results/figures/comparison.png
# in the report, results/compare/summary.json and comparison.md; the paper's comparison section reads
# the table. Ratios are this study / the other. On the submit host (cluster.ALWAYS_ON_SUBMIT_HOST):
# the other study may sit anywhere the submit host sees, not only where the image is bound.
# Two studies whose matched points differ in run-config keys beyond compare.axis are not the same
# experiment: the comparison refuses them (exit 3) and the rule fails, printing that one line (the
# log's last) naming the keys, unless compare.allow_different (then a warning line opens the text).

from pathlib import Path

from scalestudy import compare as _compare

COMPARE = config["compare"]
COMPARE_LOGS = f"{paths.LOGS_DIR}/compare"


if COMPARE["against"]:

    rule compare:
        input:
            runs=rules.table_runs.output.runs,
            other=_compare.study_file(COMPARE["against"]),
        output:
            table=table_report(os.path.basename(paths.COMPARISON_TABLE), "Comparison", "Tables"),
            summary=f"{paths.COMPARE_DIR}/summary.json",
            markdown=f"{paths.COMPARE_DIR}/comparison.md",
            png=report(
                f"{paths.FIGURES_DIR}/comparison.png",
                caption="../report/comparison.rst",
                category="Comparison",
                subcategory="Figures",
            ),
            pdf=f"{paths.PAPER_FIGURES_DIR}/comparison.pdf",
        log:
            f"{COMPARE_LOGS}/compare.log",
        conda:
            SOFTWARE_ENV
        resources:
            **light_resources(),
        params:
            against=lambda wildcards: COMPARE["against"],  # a function: never formatted
            # the other study's name: compare.label, else its folder's (scalestudy.compare.study)
            label_a=lambda wildcards: ["--label-a", COMPARE["label"]] if COMPARE["label"] else [],
            label_b=config["study"]["name"],
            axis=lambda wildcards: ["--axis", *COMPARE["axis"]] if COMPARE["axis"] else [],
            allow=["--allow-different"] if COMPARE.get("allow_different") else [],
            here=lambda wildcards, input: str(Path(input.runs).parent.parent),  # results/
            analysis=analysis_json("confidence", "train_flops_factor", "peak_tflops", "comm_model"),
        shell:
            "python -m scalestudy.compare {params.against:q} {params.here:q} {params.label_a:q}"
            " --label-b {params.label_b:q} {params.axis:q} {params.allow:q} --analysis-json {params.analysis:q}"
            " --table {output.table:q} --summary {output.summary:q} --markdown {output.markdown:q}"
            " --png {output.png:q} --pdf {output.pdf:q} > {log:q} 2>&1"
            " || {{ status=$?; tail -n 1 {log:q} >&2; exit $status; }}"

    provide("compare", rules.compare.output)
