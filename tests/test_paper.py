"""LaTeX tables: valid booktabs structure, and the numbers are the analysis tables' numbers."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from scalestudy.analysis import acceptance, commmodel, metrics, resources, settings
from scalestudy.analysis.constructed_study import run_row
from scalestudy.paper import tables
from tests.conftest import REPO

SETTINGS = settings.resolved({})


def parse_booktabs(tex: str) -> tuple[str, list[str], list[list[str]]]:
    """(column spec, header cells, body rows) of one booktabs table; asserts the structure."""
    lines = tex.strip().splitlines()
    assert lines[0] == r"\begin{table}[tbp]" and lines[-1] == r"\end{table}"
    assert tex.count(r"\begin{tabular}") == tex.count(r"\end{tabular}") == 1
    top, mid, bottom = (lines.index(rule) for rule in (r"\toprule", r"\midrule", r"\bottomrule"))
    assert top < mid < bottom and mid == top + 2
    spec = re.search(r"\\begin\{tabular\}\{(.*)\}$", lines[top - 1]).group(1)
    n_columns = len(re.findall(r"[lrc]|p\{[^}]*\}", re.sub(r">\{[^{}]*(\{[^{}]*\}[^{}]*)*\}", "", spec)))
    rows = []
    for line in [lines[top + 1], *lines[mid + 1 : bottom]]:
        assert line.endswith(r" \\"), line
        cells = [cell.strip() for cell in re.split(r"(?<!\\)&", line[:-3])]
        assert len(cells) == n_columns, line
        rows.append(cells)
    assert r"\caption{" in tex and r"\label{tab:" in tex
    return spec, rows[0], rows[1:]


@pytest.fixture(scope="module")
def scaling_table():
    rows = [run_row("scaling", 1, 1024, 0.2, mode="strong")]
    rows += [run_row("scaling", n, 1024 // n, 0.2 / (0.8 * n), mode="strong") for n in (2, 4)]
    rows += [
        run_row("scaling", n, 256, 0.1 * (1 + 0.02 * r) * (1 if n == 1 else 1.1), mode="weak", repeat=r)
        for n in (1, 2)
        for r in range(3)
    ]
    return metrics.scaling_table(metrics.run_metrics(pd.DataFrame(rows), SETTINGS), SETTINGS)


def test_escape():
    assert tables.escape("a_b & 50% #1 {x}") == r"a\_b \& 50\% \#1 \{x\}"
    # OT1 fonts print < and > as inverted ! and ?
    assert tables.escape("N <= 8, n > 1") == r"N \textless{}= 8, n \textgreater{} 1"
    assert tables.relation("variation over N <= 8: <= 10%") == r"variation over N $\leq$ 8: $\leq$ 10\,\%"


def test_headers_name_what_a_rank_drives(scaling_table):
    _, header, _ = parse_booktabs(tables.efficiency_table(scaling_table, unit="rank"))
    assert header[1:3] == ["Ranks", "Batch/rank"]


def test_efficiency_table_numbers_match(scaling_table):
    _, header, body = parse_booktabs(tables.efficiency_table(scaling_table))
    assert header[:2] == ["Mode", "GPUs"] and r"95\,\% CI" in header
    by_key = {(row[0], row[1]): dict(zip(header, row, strict=True)) for row in body}
    assert len(by_key) == len(scaling_table)
    strong4 = by_key[("strong", "4")]
    assert strong4["Efficiency"] == r"80.0\,\%"
    assert strong4["Speedup"] == "3.20"
    assert strong4["95\\,\\% CI"] == "n/a (n=1)"  # one repeat: no interval, said so
    expected = scaling_table.set_index(["mode", "world_size"]).loc[("weak", 2)]
    weak2 = by_key[("weak", "2")]
    assert weak2["Efficiency"] == f"{100 * expected['efficiency_mean']:.1f}\\,\\%"
    low, high = 100 * expected["efficiency_ci_low"], 100 * expected["efficiency_ci_high"]
    assert weak2["95\\,\\% CI"] == f"[{low:.1f}\\,\\%, {high:.1f}\\,\\%]"
    assert weak2["Images/s"] == f"{expected['images_per_s_mean']:,.0f}".replace(",", "{,}")


def test_acceptance_table_says_not_measured(scaling_table):
    sweep = pd.DataFrame(columns=["gain_vs_baseline", "images_per_s_per_gpu"])
    table = acceptance.evaluate(scaling_table, sweep, SETTINGS["acceptance"])
    _, header, body = parse_booktabs(tables.acceptance_table(table))
    cells = {row[0]: dict(zip(header, row, strict=True)) for row in body}
    strong = cells["strong-scaling efficiency at 8 GPUs"]
    assert strong["Status"] == "not measured (largest N=4)" and strong["Measured"] == "n/a"
    assert strong["Target"] == r"$\geq$ 70\,\%"
    assert cells["strong-scaling efficiency at largest measured N=4"]["Measured"] == r"80.0\,\%"


def test_sensitivity_table_marks_the_best_point():
    rows = [run_row("baseline", 1, 128, 0.128)]
    rows += [
        run_row("sensitivity", 8, b, b / ips, **{"config.precision": p, "config.bucket_cap_mb": 25})
        for p, b, ips in (("fp32", 64, 800.0), ("bf16", 128, 1500.0))
    ]
    sweep = metrics.sensitivity_table(metrics.run_metrics(pd.DataFrame(rows), SETTINGS))
    _, header, body = parse_booktabs(tables.sensitivity_table(sweep))
    assert [row[0] for row in body] == ["fp32", "bf16"]  # precision order, not alphabetical
    assert body[1][3] == r"\textbf{1{,}500}" and body[0][3] == "800"
    assert body[1][4] == r"50.0\,\%" and body[0][4] == r"-20.0\,\%"


def test_resource_table_leaves_not_applicable_cells_empty(scaling_table):
    runs = pd.DataFrame([run_row("scaling", 2, 256, 0.1, mode="weak", total_time_s=7200.0)])
    table = resources.estimate(
        runs, scaling_table, pd.DataFrame(columns=["mode", "curve", "world_size", "step_s"]), SETTINGS
    )
    _, header, body = parse_booktabs(tables.resource_table(table))
    grid = dict(zip(header, body[0], strict=True))
    assert grid["GPUs"] == "" and grid["Wall (h)"] == "2" and grid["GPU-h"] == "4"
    assert len(body) == len(table)


def test_comm_model_table_labels():
    # excess step time: a pure latency term, so beta is clipped to 0 and the bandwidth is infinite
    runs = pd.DataFrame([run_row("scaling", n, 256, 0.1 + 0.01 * (n - 1), mode="weak") for n in (1, 2, 4, 8)])
    fit, _, _ = commmodel.analyse(runs, SETTINGS)
    _, _, body = parse_booktabs(tables.comm_model_table(fit))
    cells = {row[0]: row for row in body}
    assert cells["method"][1] == "" and cells["method"][3] == "free, beta clipped to 0 (negative estimate)"
    assert cells[r"latency $\alpha_\mathrm{eff}$"][2] == r"$\mu$s"
    assert cells[r"bandwidth $1/\beta_\mathrm{eff}$"][1] == r"$\infty$"
    assert cells["degrees of freedom"][1] == "2"  # three points, one parameter left


def test_cli_writes_every_table(scaling_table, tmp_path):
    scaling_table.to_csv(tmp_path / "scaling.csv", index=False)
    assert (
        tables.main(["--scaling", str(tmp_path / "scaling.csv"), "--out-dir", str(tmp_path / "paper")]) == 0
    )
    parse_booktabs((tmp_path / "paper" / "efficiency.tex").read_text())
    assert not (tmp_path / "paper" / "acceptance.tex").exists()  # not asked for


def test_rule_outputs_match_the_tables_the_module_writes():
    """rules/paper.smk declares the .tex outputs by name; scalestudy.paper must write exactly those."""
    smk = (REPO / "rules" / "paper.smk").read_text()
    declared = re.search(r"PAPER_TABLES = \(([^)]*)\)", smk).group(1)
    assert {name.strip().strip('"') for name in declared.split(",") if name.strip()} == {
        Path(filename).stem for filename, _ in tables.TABLES.values()
    }
