"""scalestudy.preflight.site and its rules (preflight.site_rules): the driver/CUDA rule, the interface
rules and every message (known answers), the driver version of /proc (preflight.nvidia), the real
two-rank gloo check on this CPU, and rule site_check gating the training rules."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scalestudy.preflight import common, nvidia, site_rules
from scalestudy.preflight import site as sitecheck
from tests.conftest import run_snakemake, snakemake_env

PROPRIETARY = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n"
OPEN = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build  "
    "(dvs-builder@U16-I3-B15-4-3)  Sat Jul 19 01:02:03 UTC 2025\nGCC version:  gcc version 12.3.0\n"
)


def facts(**changes):
    base = {
        "host": "gpu07",
        "expected_gpus": 4,
        "driver": "580.65.06",
        "torch": "2.14.1+cu130",
        "torch_cuda": "13.0",
        "cuda_available": True,
        "visible_gpus": 4,
        "cuda_visible_devices": "0,1,2,3",
    }
    return {**base, **changes}


# --- driver and CUDA -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "version"), [(PROPRIETARY, "550.54.15"), (OPEN, "580.65.06"), ("no driver here", None)]
)
def test_the_driver_version_is_read_from_both_kernel_modules_banners(text, version):
    assert nvidia.driver_from_proc(text) == version


def test_versions_parse_and_bad_ones_are_refused():
    assert site_rules.parse_version("580.65.06") == (580, 65, 6)
    assert site_rules.parse_version("13.0") == (13, 0)
    with pytest.raises(ValueError, match="not a version"):
        site_rules.parse_version("580.xx")


@pytest.mark.parametrize(
    ("driver", "cuda", "ok"),
    [
        ("580.65.06", "13.0", True),
        ("580.0", "13.0", True),
        ("590.44.01", "13.0", True),
        ("575.57.08", "13.0", False),  # a CUDA 12.9 driver: too old for the cu130 torch
        ("550.54.15", "13.0", False),
        ("550.54.15", "12.8", True),  # CUDA minor version compatibility within 12.x
        ("525.60.13", "12.6", True),
        ("525.60.12", "12.6", False),
        ("470.256.02", "12.1", False),
        ("470.256.02", "11.8", True),
    ],
)
def test_the_driver_must_reach_the_minimum_of_torchs_cuda_major(driver, cuda, ok):
    assert site_rules.driver_is_new_enough(driver, cuda) is ok


def test_an_unknown_cuda_major_is_an_error_not_a_pass():
    with pytest.raises(ValueError, match="CUDA 10.2"):
        site_rules.minimum_driver("10.2")


def test_a_healthy_gpu_node_and_a_cpu_job_pass():
    assert site_rules.gpu_problem(facts()) is None
    assert site_rules.gpu_problem(facts(expected_gpus=0, driver=None, cuda_available=False)) is None


def test_an_old_driver_names_the_versions_and_all_three_remedies():
    message = site_rules.gpu_problem(facts(driver="550.54.15", cuda_available=False, visible_gpus=0))
    assert message.startswith("site check: the NVIDIA driver on gpu07 is 550.54.15")
    assert "torch 2.14.1+cu130 is built for CUDA 13.0 and needs a driver >= 580.x" in message
    assert "driver >= 580.x (another cluster.partition or cluster.constraint" in message
    assert "APPTAINERENV_LD_LIBRARY_PATH=/usr/local/cuda/compat" in message
    assert "cu126/cu128 wheels" in message and "container.prebuilt" in message
    assert "\n" not in message  # one paragraph


def test_an_old_driver_running_on_the_compat_libraries_passes_with_a_note():
    working = facts(driver="550.54.15")
    assert site_rules.gpu_problem(working) is None
    assert any("forward-compatibility" in note for note in site_rules.gpu_warnings(working))


def test_no_driver_on_a_node_that_should_have_gpus_points_at_the_partition():
    message = site_rules.gpu_problem(facts(driver=None, cuda_available=False, visible_gpus=0))
    assert "node gpu07 has no NVIDIA driver" in message and "cluster.partition" in message


def test_a_cpu_only_torch_in_the_image_is_named():
    message = site_rules.gpu_problem(facts(torch="2.14.1+cpu", torch_cuda=None, cuda_available=False))
    assert "CPU-only build" in message and "containers/scalestudy.def" in message


def test_no_device_with_a_good_driver_points_at_nv_and_gres():
    message = site_rules.gpu_problem(facts(cuda_available=False, visible_gpus=0, cuda_visible_devices=""))
    assert "sees no CUDA device on gpu07, although the driver 580.65.06 is new enough" in message
    assert "--nv" in message and "cluster.gpu_type" in message


def test_fewer_gpus_than_the_job_was_given_is_a_problem_more_is_a_note():
    message = site_rules.gpu_problem(facts(visible_gpus=2, cuda_visible_devices="0,1"))
    assert "torch sees 2 GPU(s) on gpu07, but the job asked for 4 per node" in message
    more = facts(visible_gpus=8)
    assert site_rules.gpu_problem(more) is None
    assert any("ConstrainDevices" in note for note in site_rules.gpu_warnings(more))


# --- network interfaces --------------------------------------------------------------------------

INTERFACES = ["lo", "eno1", "ib0", "ib1", "docker0"]


@pytest.mark.parametrize(
    ("value", "chosen"),
    [
        ("ib", ["ib0", "ib1"]),  # a prefix
        ("ib0", ["ib0"]),
        ("=ib", []),  # exact: there is no interface called "ib"
        ("=ib1", ["ib1"]),
        ("^lo,docker", ["eno1", "ib0", "ib1"]),
        ("^=ib0", ["lo", "eno1", "ib1", "docker0"]),
        ("eth", []),
        ("eth,eno", ["eno1"]),
    ],
)
def test_nccl_socket_ifname_follows_nccls_syntax(value, chosen):
    assert site_rules.nccl_ifname_matches(value, INTERFACES) == chosen


def test_gloo_socket_ifname_names_exact_interfaces():
    assert site_rules.gloo_ifname_missing("ib0,ib1", INTERFACES) == []
    assert site_rules.gloo_ifname_missing("ib", INTERFACES) == ["ib"]
    assert site_rules.gloo_ifname_missing("ib0,eth0", INTERFACES) == ["eth0"]


def test_interface_messages_name_the_variable_the_node_and_what_exists():
    assert (
        site_rules.interface_problem(
            {"NCCL_SOCKET_IFNAME": "ib", "GLOO_SOCKET_IFNAME": "ib0"}, INTERFACES, "n1"
        )
        is None
    )
    nccl = site_rules.interface_problem({"NCCL_SOCKET_IFNAME": "eth"}, INTERFACES, "n1")
    assert "NCCL_SOCKET_IFNAME='eth'" in nccl and "matches no network interface on n1" in nccl
    assert "(it has: lo, eno1, ib0, ib1, docker0)" in nccl
    gloo = site_rules.interface_problem({"GLOO_SOCKET_IFNAME": "eth0"}, INTERFACES, "n1")
    assert "GLOO_SOCKET_IFNAME='eth0' names eth0, which node n1 does not have" in gloo
    assert "control group on GPU runs" in gloo


def test_nccl_without_gloo_interface_is_a_note():
    assert site_rules.interface_warnings({"NCCL_SOCKET_IFNAME": "ib"})
    assert not site_rules.interface_warnings({"NCCL_SOCKET_IFNAME": "ib", "GLOO_SOCKET_IFNAME": "ib0"})


# --- the verdict of the job ----------------------------------------------------------------------


def test_the_verdict_takes_a_ranks_problem_a_hang_or_a_silent_launcher():
    good = {"passed": True, "host": "n1"}
    bad = {"passed": False, "host": "n2", "problem": "site check: X"}
    assert site_rules.verdict(0, [good, good], 2, 300) is None
    assert site_rules.verdict(1, [good, bad], 2, 300) == "site check: X"
    hung = site_rules.verdict(None, [], 2, 300)
    assert "did not finish within 300 s (0 reported)" in hung and "NCCL_SOCKET_IFNAME" in hung
    silent = site_rules.verdict(127, [], 2, 300)
    assert "exited with code 127 and 0 of 2 ranks reported" in silent
    assert "exited with code 0 and 1 of 2" in site_rules.verdict(0, [good], 2, 300)


def test_the_site_is_named_after_its_partition():
    assert sitecheck.site_name("gpu-h100") == "gpu-h100"
    assert sitecheck.site_name(None) == "default"


# --- for real, on this CPU -----------------------------------------------------------------------


def spec(**env):
    return {
        "launcher": "local",
        "world_size": 2,
        "nodes": 1,
        "tasks_per_node": 2,
        "env": {"OMP_NUM_THREADS": "1", **env},
    }


def run_check(out: Path, launch_spec: dict) -> subprocess.CompletedProcess:
    command = [
        sys.executable,
        "-m",
        "scalestudy.preflight.site",
        "run",
        "--launch-json",
        json.dumps(launch_spec),
    ]
    command += ["--backend", "gloo", "--device", "cpu", "--timeout-s", "60", "--out", str(out)]
    return subprocess.run(command, capture_output=True, text=True, env=snakemake_env(), timeout=300)


def test_two_gloo_ranks_start_through_the_launcher_and_all_reduce(tmp_path):
    out = tmp_path / "site" / "default.json"
    result = run_check(out, spec())
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["passed"] and record["world_size"] == 2 and len(record["ranks"]) == 2
    collectives = sorted(
        (rank["collective"]["rank"], rank["collective"]["backend"]) for rank in record["ranks"]
    )
    assert collectives == [(0, "gloo"), (1, "gloo")]
    assert record["provenance"]["git_commit"]
    assert [path.name for path in out.parent.iterdir()] == ["default.json"]  # no scratch left behind


def test_a_study_without_multi_rank_points_checks_one_rank_without_a_process_group(tmp_path):
    out = tmp_path / "site" / "default.json"
    result = run_check(out, {"launcher": "local", "world_size": 1, "env": {"OMP_NUM_THREADS": "1"}})
    assert result.returncode == 0, result.stderr[-3000:]
    (rank,) = json.loads(out.read_text())["ranks"]
    assert rank["collective"]["skipped"] == "one rank"


def test_a_missing_gloo_interface_fails_fast_with_the_message_and_no_result(tmp_path):
    out = tmp_path / "site" / "default.json"
    result = run_check(out, spec(GLOO_SOCKET_IFNAME="nosuchif0"))
    assert result.returncode == 1
    assert "site check: GLOO_SOCKET_IFNAME='nosuchif0' names nosuchif0" in result.stderr
    assert not out.exists()


def test_gpus_asked_for_on_a_node_without_a_driver_fail_fast_naming_the_partition(tmp_path):
    """This machine has no GPU: a job given one GPU per node must stop before any process group."""
    out = tmp_path / "site" / "gpu.json"
    result = run_check(out, {**spec(), "gpus_per_node": 1})
    assert result.returncode == 1 and not out.exists()
    assert "asked for 1 GPU(s) per node, but node" in result.stderr and "cluster.partition" in result.stderr


def test_a_bad_launch_spec_is_bad_input(tmp_path):
    result = run_check(tmp_path / "x.json", {"world_size": 0})
    assert result.returncode == 2 and "world_size must be an integer >= 1" in result.stderr


# --- the shared runner (preflight.common), as the site check uses it -----------------------------


def test_the_launcher_argv_starts_a_rank_module_or_the_trainer():
    spec = {"world_size": 2, "launcher": "local"}
    argv = common.launch_argv(spec, ["rank", "--backend", "gloo"], module=sitecheck.MODULE)
    assert argv[:3] == [sys.executable, "-m", "scalestudy.launch"]
    assert json.loads(argv[argv.index("--launch-json") + 1]) == spec
    assert argv[argv.index("--module") + 1] == "scalestudy.preflight.site"
    assert argv[argv.index("--") + 1 :] == ["rank", "--backend", "gloo"]
    trainer = common.launch_argv(spec, ["--out-dir", "d"])
    assert "--module" not in trainer and trainer[-3:] == ["--", "--out-dir", "d"]


def test_a_command_s_output_goes_to_the_log_and_is_kept(capfd):
    code, lines = common.run_logged([sys.executable, "-c", "import sys; print('out'); sys.exit(3)"])
    assert (code, lines) == (3, ["out\n"])
    assert "out" in capfd.readouterr().err


def test_a_command_past_its_deadline_is_stopped_with_its_process_group(tmp_path):
    """The site check's hung ranks: SIGTERM to the whole group (the child's children too), code None."""
    pid_file = tmp_path / "grandchild.pid"
    script = (
        "import subprocess, sys, time; "
        f"child = subprocess.Popen(['sleep', '120']); open({str(pid_file)!r}, 'w').write(str(child.pid)); "
        "print('started', flush=True); time.sleep(120)"
    )
    started = time.monotonic()
    code, lines = common.run_logged([sys.executable, "-c", script], timeout_s=2)
    assert code is None and lines == ["started\n"]
    assert time.monotonic() - started < common.KILL_AFTER_S
    grandchild = int(pid_file.read_text())
    for _ in range(50):  # reaped by init once killed
        if (
            not Path(f"/proc/{grandchild}").exists()
            or "Z" in Path(f"/proc/{grandchild}/stat").read_text().split()[2]
        ):
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the grandchild {grandchild} outlived the deadline")


# --- the workflow --------------------------------------------------------------------------------


BASELINE = "results/runs/baseline/default/summary.json"


def test_every_training_rule_waits_for_the_site_check(workflow_copy):
    result = run_snakemake(workflow_copy, BASELINE, "-n")
    assert "site_check" in result.stdout and "baseline_run" in result.stdout
    off = workflow_copy / "config" / "no_check.yaml"
    off.write_text((workflow_copy / "config" / "demo.yaml").read_text() + "\nsite_check:\n  enabled: false\n")
    result = run_snakemake(workflow_copy, BASELINE, "-n", "--configfile", str(off))
    assert "site_check" not in result.stdout and "baseline_run" in result.stdout


def test_the_site_check_job_has_its_short_wall_time_and_no_checkpoint_signal():
    """The training jobs' --signal=USR1@<lead> would hit the check's ranks (nothing to checkpoint)
    at or near their start when the lead exceeds the check's short wall time."""
    import yaml
    from snakemake.utils import validate

    from scalestudy.plan import cluster
    from tests.conftest import REPO

    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    validate(config, str(REPO / "config/schema.yaml"))
    config["cluster"]["signal_lead_s"] = 900
    training = cluster.train_resources(config, 2, 1)
    check = sitecheck.job_resources(config, 2, 1)
    assert "--signal=USR1@900" in training["slurm_extra"]
    assert "--signal" not in check["slurm_extra"]
    assert "--ntasks-per-node" in check["slurm_extra"]
    assert check["runtime"] == config["site_check"]["runtime_minutes"] < training["runtime"]
