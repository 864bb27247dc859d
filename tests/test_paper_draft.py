"""The paper draft: numbers.tex from the tables, paper.tex from the template (no typed numbers, no
undefined macro), the command lines. The PDF and the rule's PDF target: test_paper_pdf.py."""

# ruff: noqa: F811 - the fixtures imported from tests/paper_study.py are the tests' parameters

from __future__ import annotations

import re

import pandas as pd
import pytest

from scalestudy.analysis import commmodel, metrics, resources
from scalestudy.paper import build, draft, numbers
from scalestudy.paper.macros import NOT_MEASURED, Numbers, defined_names, spell
from tests.paper_study import (  # noqa: F401 - study_tables, study_numbers: module-scoped fixtures
    BIB,
    CONTEXT,
    SETTINGS,
    TEMPLATE,
    study_numbers,
    study_tables,
    write_numbers,
)


def value(numbers_: Numbers, name: str) -> str:
    return numbers_.macros[name].value


# --------------------------------------------------------------------------- macro names
@pytest.mark.parametrize(
    "n, words",
    [
        (1, "One"),
        (8, "Eight"),
        (16, "Sixteen"),
        (21, "TwentyOne"),
        (100, "OneHundred"),
        (1024, "OneThousandTwentyFour"),
        (2_000_512, "TwoMillionFiveHundredTwelve"),
    ],
)
def test_spell(n, words):
    assert spell(n) == words


def test_macro_names_hold_no_digit_and_are_defined_once():
    table = Numbers()
    table.add("StrongEffAtEight", "80", "here")
    with pytest.raises(ValueError, match="letters only"):
        table.add("StrongEffAt8", "80", "here")
    with pytest.raises(ValueError, match="letters only"):
        table.add("strongEff", "80", "here")  # lower-case first: the draft could not tell it from LaTeX's
    with pytest.raises(ValueError, match="defined twice"):
        table.add("StrongEffAtEight", "81", "there")
    assert table.render().splitlines()[-1] == r"\newcommand{\StrongEffAtEight}{80}% here"


# --------------------------------------------------------------------------- numbers from the tables
def test_numbers_are_the_tables_numbers_with_their_sources(study_numbers, study_tables):
    assert value(study_numbers, "StrongEffAtFour") == r"80.0\,\%"
    assert value(study_numbers, "StrongEffAtLargest") == r"80.0\,\%"
    assert value(study_numbers, "StrongLargestWorld") == "4"
    assert "scaling.csv mode=strong world_size=4" in study_numbers.macros["StrongEffAtFour"].source
    assert "runs: scaling/strong/w4_r0" in study_numbers.macros["StrongEffAtFour"].source
    weak = study_tables["scaling"].set_index(["mode", "world_size"]).loc[("weak", 2)]
    assert value(study_numbers, "WeakEffAtTwo") == f"{100 * weak['efficiency_mean']:.1f}\\,\\%"
    low, high = 100 * weak["efficiency_ci_low"], 100 * weak["efficiency_ci_high"]
    assert value(study_numbers, "WeakEffIntervalAtTwo") == f"[{low:.1f}\\,\\%, {high:.1f}\\,\\%]"
    assert value(study_numbers, "StrongEffIntervalAtFour") == "no interval (1 repeat)"
    assert value(study_numbers, "SensitivityBestPrecision") == "bf16"
    assert "sensitivity/bf16/bs128_bucket25" in study_numbers.macros["SensitivityBestPrecision"].source
    assert value(study_numbers, "ProfileCommShareAtTwo") == r"25.0\,\%"
    assert value(study_numbers, "ProfileOverlapAtLargest") == r"50.0\,\%"


def test_a_point_the_grid_does_not_reach_is_not_measured(study_numbers):
    # the acceptance criterion is set at 8 GPUs; the grid stops at 4
    assert value(study_numbers, "StrongEffAtEight") == NOT_MEASURED
    assert value(study_numbers, "AcceptStrongVerdict") == "not measured (largest N=4)"
    assert value(study_numbers, "AcceptanceNotMeasured") == "2"
    for name in ("SystemCPU", "SystemNetwork", "BenchAlpha", "WindowFilled", "SmActive"):
        assert value(study_numbers, name) == NOT_MEASURED  # tables/columns not given


def test_wording_follows_the_data(study_tables):
    gpu = numbers.build(study_tables, CONTEXT)
    assert value(gpu, "Unit") == "GPU" and value(gpu, "UnitHours") == "GPU-hours"
    assert (
        value(gpu, "DataSource") == r"CIFAR-10~\cite{krizhevsky2009cifar}" and value(gpu, "DataCaveat") == ""
    )
    cpu_runs = study_tables["runs"].assign(device="cpu")
    demo = numbers.build({**study_tables, "runs": cpu_runs}, {**CONTEXT, "data_source": "synthetic"})
    assert value(demo, "Unit") == "CPU rank" and value(demo, "Units") == "CPU ranks"
    assert value(demo, "DataSource").startswith("synthetic images") and "or GPUs" in value(demo, "DataCaveat")
    assert value(demo, "SensitivityBestThroughput").endswith("images/s per CPU rank")


def test_optional_tables_of_other_stages_are_used_when_given(study_tables):
    system = pd.DataFrame(
        [
            {
                "host": "gpu01",
                "cpu_model": "EPYC 9654",
                "cores": 96,
                "gpus": 8,
                "gpu_model": "H100",
                "infiniband": "mlx5_0 400 Gb/s",
                "network": "eth0",
            }
        ]
    )
    bench = pd.DataFrame(
        [
            {
                "collective": "all_reduce",
                "world_size": w,
                "placement": "intra-node",
                "alpha_s": 1e-5 * w,
                "bandwidth_gb_s": 100.0 + w,
            }
            for w in (2, 8)
        ]
    )
    runs = study_tables["runs"].assign(window_filled=[True] * (len(study_tables["runs"]) - 1) + [False])
    built = numbers.build({**study_tables, "system": system, "comm_bench_fit": bench, "runs": runs}, CONTEXT)
    assert value(built, "SystemCPU") == "EPYC 9654 (96 cores)"
    assert value(built, "SystemGPU") == "8x H100"
    assert value(built, "SystemNetwork") == "InfiniBand mlx5\\_0 400 Gb/s, network eth0"
    assert value(built, "SystemOS") == NOT_MEASURED  # a column it needs is absent
    assert value(built, "BenchAlpha") == r"80~$\mu$s" and value(built, "BenchBandwidth") == "108~GB/s"
    assert "all-reduce at 8 GPUs (intra-node)" in value(built, "BenchSummary")
    scored = runs[runs["stage"] != "profile"]  # profile runs have no window to fill
    assert value(built, "WindowFilled") == f"{int(scored['window_filled'].sum())} of {len(scored)}"
    profile_unfilled = runs.assign(stage=["profile"] + list(runs["stage"].iloc[1:]), window_filled=False)
    rebuilt = numbers.build({**study_tables, "runs": profile_unfilled}, CONTEXT)
    assert value(rebuilt, "WindowFilled") == f"0 of {len(runs) - 1}"


def energy_tables(study_tables) -> dict[str, pd.DataFrame]:
    """The constructed study with energy measured: 300 W per GPU, joules known per point."""
    runs = study_tables["runs"].copy()
    world = runs["world_size"]
    runs["energy_source"] = "counter"
    runs["mean_power_w"] = 300.0 * world
    runs["joules_per_sample"] = runs["mean_power_w"] / runs["images_per_s"]
    runs["joules_per_sample_run"] = 1.25 * runs["joules_per_sample"]
    runs["energy_to_target_j"] = runs["mean_power_w"] * runs["time_to_target_s"]
    runs["gpu_hours_to_target"] = world * runs["time_to_target_s"] / 3600
    runs["energy_j"] = runs["mean_power_w"] * runs["total_time_s"]
    runs["sacct.energy_consumed_j"] = [2.0e6] + [None] * (len(runs) - 1)
    per_run = metrics.run_metrics(runs, SETTINGS)
    scaling = metrics.scaling_table(per_run, SETTINGS)
    _, _, prediction = commmodel.analyse(runs, SETTINGS)
    estimate = resources.estimate(runs, scaling, prediction, SETTINGS)
    return {**study_tables, "runs": runs, "scaling": scaling, "resources": estimate}


def test_the_energy_paragraph_holds_the_measured_numbers(study_tables):
    tables_ = energy_tables(study_tables)
    built = numbers.build(tables_, CONTEXT)
    assert value(built, "EnergySource").startswith("NVML's total energy counter")
    strong = tables_["scaling"].query("mode == 'strong'").set_index("world_size")
    at_one = strong.loc[1, "joules_per_sample_mean"]  # 300 W / (1024 / 0.2 images/s)
    assert at_one == pytest.approx(300.0 / (1024 / 0.2))
    assert value(built, "StrongJoulesPerSampleAtReference") == f"{at_one * 1000:.3g}~mJ per image"
    assert value(built, "StrongJoulesPerSampleRunAtLargest").endswith("per image")
    cheapest = strong["energy_to_target_j_mean"].idxmin()
    assert value(built, "StrongCheapestEnergyPoint").startswith(f"{cheapest} GPU")
    assert value(built, "StrongCheapestHoursPoint").endswith("GPU-hours)")
    assert value(built, "SacctEnergy").startswith("2~MJ over 1 of")
    grid = tables_["resources"].query("what == 'whole grid'").iloc[0]
    assert value(built, "GridEnergy") == f"{grid['kwh']:.3g}~kWh"


def test_without_energy_every_energy_macro_says_not_measured_and_why(study_tables):
    cpu = study_tables["runs"].assign(
        energy_source="not measured: no NVIDIA GPU (device cpu)", **{"sacct.note": "accounting not queried"}
    )
    per_run = metrics.run_metrics(cpu, SETTINGS)
    scaling = metrics.scaling_table(per_run, SETTINGS)
    built = numbers.build({**study_tables, "runs": cpu, "scaling": scaling}, CONTEXT)
    assert value(built, "EnergySource") == "nothing: energy was not measured: no NVIDIA GPU (device cpu)"
    for name in (
        "StrongJoulesPerSampleAtReference",
        "StrongJoulesPerSampleAtLargest",
        "StrongCheapestEnergyPoint",
        "GridEnergy",
    ):
        assert value(built, name) == NOT_MEASURED, name
    assert value(built, "SacctEnergy") == "not measured (no Slurm accounting in runs.csv)"


def test_no_tables_at_all_gives_a_complete_set_of_not_measured_macros():
    empty = numbers.build({}, CONTEXT)
    used = set(re.findall(r"\\([A-Z][A-Za-z]*)", draft.strip_comments(TEMPLATE.read_text())))
    assert not draft.undefined_macros(TEMPLATE.read_text(), set(empty.macros))
    assert value(empty, "StrongEffAtLargest") == NOT_MEASURED and "StrongEffAtLargest" in used


# --------------------------------------------------------------------------- the template's rules
def test_every_macro_the_template_uses_is_defined_from_the_data(study_numbers):
    assert draft.undefined_macros(TEMPLATE.read_text(), set(study_numbers.macros)) == {}


def test_the_template_types_no_number():
    assert draft.hand_typed_numbers(TEMPLATE.read_text()) == []


@pytest.mark.parametrize(
    "line, typed",
    [
        (r"We used 8 GPUs.", True),
        (r"$X_1$ is the reference.", True),
        (r"at \StrongLargestWorld{} GPUs", False),
        (r"see Table~\ref{tab:fig2} and \cite{he2016resnet}", False),
        (r"\includegraphics[width=0.5\linewidth]{figures/a1.pdf}", False),
        (r"costs $\const{2}(N-\const{1})$ steps", False),
        (r"text % a comment with 8 in it", False),
        (r"a 50\% share", True),
    ],
)
def test_hand_typed_numbers(line, typed):
    tex = "\\documentclass{article}\n\\begin{document}\n" + line + "\n\\end{document}\n"
    assert bool(draft.hand_typed_numbers(tex)) is typed


def test_preamble_numbers_are_layout_not_text():
    tex = "\\usepackage[margin=2.5cm]{geometry}\n\\begin{document}\nno digits\n\\end{document}\n"
    assert draft.hand_typed_numbers(tex) == []


def test_draft_refuses_a_typed_number_or_an_undefined_macro_and_writes_nothing(tmp_path, study_numbers):
    numbers_tex = write_numbers(tmp_path, study_numbers)
    bad = tmp_path / "template.tex"
    bad.write_text("\\begin{document}\nWe used 8 GPUs and \\StrongEffAtSixtyFour.\n\\end{document}\n")
    out = tmp_path / "paper" / "paper.tex"
    args = ["--template", str(bad), "--bib", str(BIB), "--numbers", str(numbers_tex), "--out", str(out)]
    with pytest.raises(SystemExit) as error:
        draft.main(args)
    message = str(error.value)
    assert f"{bad}:2: macro \\StrongEffAtSixtyFour is not defined" in message
    assert f"{bad}:2: a number typed by hand" in message
    assert not out.exists()


# --------------------------------------------------------------------------- command lines
def test_numbers_cli_rejects_an_unknown_table(tmp_path):
    with pytest.raises(SystemExit, match="--table nonsense: unknown table"):
        numbers.main(["--table", f"nonsense={tmp_path}", "--out", str(tmp_path / "n.tex")])


def test_numbers_cli_writes_one_macro_per_line(tmp_path, study_tables):
    args = []
    for name in ("runs", "scaling"):
        study_tables[name].to_csv(tmp_path / f"{name}.csv", index=False)
        args.append(f"{name}={tmp_path / f'{name}.csv'}")
    out = tmp_path / "numbers.tex"
    assert (
        numbers.main(["--table", *args, "--context-json", '{"data_source": "cifar10"}', "--out", str(out)])
        == 0
    )
    text = out.read_text()
    assert r"\newcommand{\StrongEffAtFour}{80.0\,\%}% scaling.csv mode=strong world_size=4" in text
    assert r"\newcommand{\SensitivityBestGain}{not measured}% sensitivity.csv not given" in text
    assert {"StrongEffAtFour", "SensitivityBestGain"} <= defined_names(text)


@pytest.mark.parametrize(
    "log_line, is_problem",
    [
        ("LaTeX Warning: Reference `fig:x' on page 2 undefined on input line 80.", True),
        ("Package natbib Warning: Citation `pytorch' on page 1 undefined on input line 31.", True),
        ("LaTeX Warning: There were undefined references.", True),
        ("! Undefined control sequence.", True),
        ("./paper.tex:77: Missing $ inserted.", True),
        ("Overfull \\hbox (2.1pt too wide) in paragraph at lines 40--41", False),
        ("LaTeX Font Info:    External font `cmex10' loaded for size", False),
    ],
)
def test_latex_log_problems(log_line, is_problem):
    assert bool(build.problems(f"This is pdfTeX\n{log_line}\nOutput written")) is is_problem


def test_build_without_latexmk_says_what_to_install(tmp_path):
    (tmp_path / "paper.tex").write_text("x")
    assert (
        build.main(
            [
                "--tex",
                str(tmp_path / "paper.tex"),
                "--pdf",
                str(tmp_path / "p.pdf"),
                "--latexmk",
                "no-such-latexmk",
            ]
        )
        == 2
    )
    assert not (tmp_path / "p.pdf").exists()
