"""The collective benchmark: nccl-tests' bandwidth arithmetic, the alpha-beta fit with known answers,
real gloo ranks through scalestudy.launch.launcher, and its acceptance row."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from scalestudy.analysis import acceptance
from scalestudy.preflight import collectives as commbench
from tests.conftest import REPO, snakemake_env

MIB = 1 << 20


# --------------------------------------------------------------------------- nccl-tests arithmetic


@pytest.mark.parametrize(
    ("collective", "n", "factor"),
    [
        ("all_reduce", 2, 1.0),  # 2(n-1)/n
        ("all_reduce", 8, 1.75),
        ("all_reduce", 1, 0.0),
        ("all_gather", 4, 0.75),  # (n-1)/n
        ("reduce_scatter", 8, 0.875),
        ("all_gather", 1, 0.0),
    ],
)
def test_bus_factor_is_nccl_tests_definition(collective, n, factor):
    assert commbench.bus_factor(collective, n) == pytest.approx(factor)


def test_algbw_and_busbw_known_answers():
    # 256 MiB in 2 ms: algbw = 268435456 B / 0.002 s = 134.217728 GB/s (nccl-tests' GB = 1e9 B)
    assert commbench.algbw_gb_s(256 * MIB, 0.002) == pytest.approx(134.217728)
    # all-reduce on 8 ranks: busbw = algbw * 2 * 7 / 8
    assert commbench.busbw_gb_s("all_reduce", 8, 256 * MIB, 0.002) == pytest.approx(134.217728 * 1.75)
    # all-gather on 4 ranks: busbw = algbw * 3 / 4
    assert commbench.busbw_gb_s("all_gather", 4, 1e9, 0.1) == pytest.approx(7.5)
    with pytest.raises(ValueError, match="unknown collective 'broadcast'"):
        commbench.bus_factor("broadcast", 2)


def test_ring_steps():
    assert commbench.ring_steps("all_reduce", 8) == 14
    assert commbench.ring_steps("reduce_scatter", 8) == 7
    assert commbench.ring_steps("all_gather", 2) == 1


def test_message_sizes_are_nccl_tests_b_e_f():
    sizes = commbench.message_sizes(8, 256 * MIB, 2)
    assert sizes[0] == 8 and sizes[-1] == 256 * MIB and len(sizes) == 26  # 2^3 .. 2^28
    assert commbench.message_sizes(8, 8 * MIB, 4) == [8 * 4**k for k in range(11)]
    with pytest.raises(ValueError, match="step_factor >= 2"):
        commbench.message_sizes(8, 64, 1)
    with pytest.raises(ValueError, match="min_bytes <= max_bytes"):
        commbench.message_sizes(64, 8, 2)


def test_elements_split_evenly_over_ranks_for_gather_and_scatter():
    assert commbench.elements_for("all_reduce", 8, 4) == 2
    assert commbench.elements_for("all_gather", 8, 4) == 4  # at least one element per rank
    assert commbench.elements_for("reduce_scatter", 1000, 3) == 249  # 250 floats rounded down to 3x
    assert commbench.elements_for("all_reduce", 2, 2) == 1


def test_placement():
    assert commbench.placement(["n1", "n1"]) == "intra-node"
    assert commbench.placement(["n1", "n2"]) == "inter-node"


# --------------------------------------------------------------------------- the alpha-beta fit


ALPHA, BETA = 12e-6, 1 / 40e9
SIZES = commbench.message_sizes(8, 256 * MIB, 2)


def test_fit_recovers_constructed_alpha_and_beta():
    times = [ALPHA + BETA * s for s in SIZES]
    fitted = commbench.fit_alpha_beta(SIZES, times)
    assert fitted["alpha_s"] == pytest.approx(ALPHA, rel=1e-9)
    assert fitted["beta_s_per_byte"] == pytest.approx(BETA, rel=1e-9)
    assert fitted["r2"] == pytest.approx(1.0)
    assert fitted["points"] == len(SIZES) and "clipped" not in fitted["method"]


def test_fit_with_noise_stays_close_at_both_ends():
    rng = np.random.default_rng(1)
    times = [(ALPHA + BETA * s) * (1 + 0.03 * rng.standard_normal()) for s in SIZES]
    fitted = commbench.fit_alpha_beta(SIZES, times)
    # the relative-error fit keeps the latency honest despite eight decades of sizes
    assert fitted["alpha_s"] == pytest.approx(ALPHA, rel=0.05)
    assert fitted["beta_s_per_byte"] == pytest.approx(BETA, rel=0.05)


def test_negative_alpha_is_clipped_and_said():
    sizes = [1e6, 2e6, 4e6]
    fitted = commbench.fit_alpha_beta(sizes, [BETA * s - 1e-6 for s in sizes])
    assert fitted["alpha_s"] == 0.0 and fitted["beta_s_per_byte"] > 0
    assert "alpha clipped to 0" in fitted["method"]


def test_too_few_sizes_is_not_fitted():
    fitted = commbench.fit_alpha_beta([8, 16], [1e-5, math.nan])
    assert math.isnan(fitted["alpha_s"]) and fitted["method"].startswith("not fitted")


def bench_rows(collective="all_reduce", world=8, placement="inter-node", nodes=2, alpha=ALPHA, beta=BETA):
    rows = []
    for size in SIZES:
        t = alpha + beta * size
        rows.append(
            {
                "collective": collective,
                "world_size": world,
                "nodes": nodes,
                "placement": placement,
                "backend": "nccl",
                "bytes": size,
                "time_s": t,
                "busbw_gb_s": commbench.busbw_gb_s(collective, world, size, t),
                "repeats": 20,
                "note": "",
            }
        )
    return rows


def test_fit_table_gives_the_ring_model_its_link_parameters():
    bench = pd.DataFrame(bench_rows() + bench_rows("all_gather", 4, "intra-node", 1))
    table = commbench.fit_table(bench).set_index("collective")
    ar, ag = table.loc["all_reduce"], table.loc["all_gather"]
    assert ar["alpha_s"] == pytest.approx(ALPHA) and ar["beta_s_per_byte"] == pytest.approx(BETA)
    assert ar["algbw_gb_s"] == pytest.approx(40.0)
    assert ar["bandwidth_gb_s"] == pytest.approx(40.0 * 1.75)  # bus bandwidth = 2(n-1)/n / beta
    assert ar["link_alpha_s"] == pytest.approx(ALPHA / 14)  # per ring step, 2(n-1)
    assert ag["bandwidth_gb_s"] == pytest.approx(40.0 * 0.75) and ag["link_alpha_s"] == pytest.approx(
        ALPHA / 3
    )
    assert ar["max_bytes"] == 256 * MIB
    assert ar["busbw_at_max_gb_s"] == pytest.approx(
        commbench.busbw_gb_s("all_reduce", 8, 256 * MIB, ALPHA + BETA * 256 * MIB)
    )


def test_settings_are_checked_naming_the_key():
    with pytest.raises(ValueError, match="unknown key"):
        commbench.settings_from_json('{"sizes": [8]}')
    with pytest.raises(ValueError, match="comm_bench.collectives"):
        commbench.settings_from_json('{"collectives": ["broadcast"]}')
    with pytest.raises(ValueError, match="comm_bench.iters"):
        commbench.settings_from_json('{"iters": 0}')
    assert commbench.settings_from_json("{}")["max_bytes"] == 256 * MIB


# --------------------------------------------------------------------------- unsupported collectives


class _RefusingDist:
    def reduce_scatter_single(self, *args):
        raise RuntimeError("ProcessGroupX does not support reduce_scatter")


def test_a_collective_the_backend_lacks_is_a_row_without_a_number():
    import torch

    bench = object.__new__(commbench.Bench)
    bench.torch, bench.dist = torch, _RefusingDist()
    bench.settings = {"warmup_iters": 1, "iters": 2}
    bench.device, bench.backend, bench.rank, bench.world = torch.device("cpu"), "gloo", 0, 2
    where = {
        "world_size": 2,
        "nodes": 1,
        "placement": "intra-node",
        "hosts": "h",
        "backend": "gloo",
        "device": "cpu",
    }
    rows = commbench._collective_rows(bench, "reduce_scatter", [8, 64], where, is_main=True)
    assert len(rows) == 2
    assert all(math.isnan(row["time_s"]) and math.isnan(row["busbw_gb_s"]) for row in rows)
    assert all(
        row["note"].startswith("not measured: reduce_scatter is not supported by gloo") for row in rows
    )
    table = commbench.fit_table(pd.DataFrame(rows))
    assert table["method"].iloc[0].startswith("not fitted") and "not supported" in table["method"].iloc[0]


# --------------------------------------------------------------------------- real ranks


def launch_bench(tmp_path, world, settings):
    spec = {"launcher": "local", "world_size": world, "env": {"OMP_NUM_THREADS": "1"}}
    out = tmp_path / f"w{world}.csv"
    command = [
        sys.executable, "-m", "scalestudy.launch", "--launch-json", json.dumps(spec),
        "--module", "scalestudy.preflight.collectives", "--",
        "run", "--settings-json", json.dumps(settings), "--out", str(out),
    ]  # fmt: skip
    result = subprocess.run(
        command, cwd=REPO, env=snakemake_env(), capture_output=True, text=True, timeout=300
    )
    return result, out


def test_two_gloo_ranks_through_launch_measure_every_collective(tmp_path):
    settings = {"min_bytes": 8, "max_bytes": 4096, "step_factor": 8, "warmup_iters": 1, "iters": 3}
    settings |= {"device": "cpu", "backend": "gloo"}
    result, out = launch_bench(tmp_path, 2, settings)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = pd.read_csv(out)
    assert sorted(set(rows["collective"])) == ["all_gather", "all_reduce", "reduce_scatter"]
    assert list(rows.loc[rows["collective"] == "all_reduce", "bytes"]) == [8, 64, 512, 4096]
    assert (rows["world_size"] == 2).all() and (rows["placement"] == "intra-node").all()
    assert (rows["backend"] == "gloo").all() and (rows["repeats"] == 3).all()
    assert (rows["time_s"] > 0).all()
    for _, row in rows.iterrows():  # the CSV's bandwidths follow nccl-tests' definitions
        algbw = row["bytes"] / row["time_s"] / 1e9
        assert row["algbw_gb_s"] == pytest.approx(algbw)
        assert row["busbw_gb_s"] == pytest.approx(algbw * commbench.bus_factor(row["collective"], 2))
    assert "provenance.git_commit" in rows and rows["provenance.versions.torch"].notna().all()

    busbw, fit = tmp_path / "busbw.csv", tmp_path / "fit.csv"
    assert commbench.main(["fit", "--bench", str(out), "--busbw-out", str(busbw), "--fit-out", str(fit)]) == 0
    table = pd.read_csv(fit)
    assert list(table.columns) == list(commbench.FIT_COLUMNS) and len(table) == 3
    assert len(pd.read_csv(busbw)) == len(rows)


def test_one_rank_is_refused_with_the_reason(tmp_path):
    result, out = launch_bench(tmp_path, 1, {"device": "cpu", "backend": "gloo", "max_bytes": 64})
    assert result.returncode == 2 and not out.exists()
    assert "comm_bench needs at least 2 ranks" in result.stderr


# --------------------------------------------------------------------------- acceptance row


def test_busbw_acceptance_row_at_the_largest_message():
    bench = pd.DataFrame(bench_rows() + bench_rows(world=4, placement="intra-node", nodes=1, beta=1 / 100e9))
    rows = {row["criterion"]: row for row in acceptance.busbw_rows(bench, minimum=50.0)}
    inter = rows["all-reduce bus bandwidth at the largest message (comm_bench), inter-node"]
    expected = commbench.busbw_gb_s("all_reduce", 8, 256 * MIB, ALPHA + BETA * 256 * MIB)
    assert inter["measured"] == pytest.approx(expected) and inter["world_size"] == 8
    assert inter["status"] == acceptance.PASS  # ~70 GB/s >= 50
    intra = rows["all-reduce bus bandwidth at the largest message (comm_bench), intra-node"]
    assert intra["status"] == acceptance.PASS and intra["target"] == ">= 50 GB/s"
    failing = acceptance.busbw_rows(bench, minimum=500.0)
    assert {row["status"] for row in failing} == {acceptance.FAIL}
    informative = acceptance.busbw_rows(bench, minimum=None)
    assert {row["status"] for row in informative} == {acceptance.INFORMATIVE}
    assert acceptance.busbw_rows(None, 50.0)[0]["status"] == acceptance.NOT_MEASURED


def test_launch_starts_the_benchmark_module_as_every_rank(capsys):
    from scalestudy.launch import launcher as launch

    spec = {"world_size": 4, "nodes": 2, "tasks_per_node": 2, "launcher": "srun"}
    command = launch.build_command(spec, ["run", "--out", "x.csv"], module="scalestudy.preflight.collectives")
    assert command[0] == "srun" and command[-5:] == [
        "-m",
        "scalestudy.preflight.collectives",
        "run",
        "--out",
        "x.csv",
    ]
    local = launch.build_command(
        {**spec, "launcher": "local"}, ["run"], module="scalestudy.preflight.collectives"
    )
    assert local[local.index("scalestudy.launch.torchrun") :][-3:] == [
        "-m",
        "scalestudy.preflight.collectives",
        "run",
    ]
    argv = [
        "--launch-json",
        '{"world_size": 1, "launcher": "local"}',
        "--module",
        "scalestudy.preflight.collectives",
    ]
    assert launch.main([*argv, "--dry-run", "--", "fit"]) == 0
    assert capsys.readouterr().out.split()[-3:] == ["-m", "scalestudy.preflight.collectives", "fit"]
    assert launch.build_command({**spec, "launcher": "local"}, [])[-1] == launch.TRAINER_MODULE  # default


def test_a_grid_without_multi_rank_sizes_gives_empty_tables_with_headers(tmp_path):
    busbw, fit = tmp_path / "busbw.csv", tmp_path / "fit.csv"
    assert commbench.main(["fit", "--bench", "--busbw-out", str(busbw), "--fit-out", str(fit)]) == 0
    assert busbw.read_text().startswith("collective,world_size,nodes,placement,hosts,")
    assert fit.read_text().strip() == ",".join(commbench.FIT_COLUMNS)
    assert acceptance.busbw_rows(pd.read_csv(busbw), None)[0]["status"] == acceptance.NOT_MEASURED
