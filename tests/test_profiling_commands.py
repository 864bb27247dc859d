"""Profiler commands (nsys per rank inside srun/apptainer, nsys stats, ncu), tool choice, run flow."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import threading
from pathlib import Path

import pytest

from scalestudy.launch import launcher as launch
from scalestudy.profiling import ncu, nsys, run, tool
from scalestudy.profiling.schema import DATA_RANGE, STEP_RANGE

SPEC = {
    "launcher": "srun",
    "world_size": 4,
    "nodes": 2,
    "tasks_per_node": 2,
    "cpus_per_task": 8,
    "gres": "gpu:2",
}
RUN = {
    "world_size": 2,
    "device": "auto",
    "checkpoint_dir": "results/checkpoints/profile/w2",
    "profile": {"tool": "auto", "start_step": 2, "steps": 2},
}


def index_of(argv: list[str], word: str) -> int:
    return next(i for i, item in enumerate(argv) if item == word or item.endswith(word))


# --- nsys ------------------------------------------------------------------------------------------


def test_nsys_prefix_captures_the_profiler_window_per_rank():
    prefix = nsys.profile_prefix("results/runs/profile/w4/nsys", "SLURM_PROCID")
    assert prefix[:2] == ["nsys", "profile"]
    assert prefix[prefix.index("--trace") + 1] == "cuda,nvtx,osrt,cudnn,cublas"
    assert "--capture-range=cudaProfilerApi" in prefix
    assert "--capture-range-end=stop" in prefix  # the default (stop-shutdown) would kill the run
    assert "--sample=none" in prefix and "--cpuctxsw=none" in prefix  # no CPU sampling (perf_event)
    assert prefix[-1] == "results/runs/profile/w4/nsys/%q{SLURM_JOB_ID}_r%q{SLURM_PROCID}"


def test_nsys_goes_inside_srun_and_apptainer_never_around_srun():
    spec = {**SPEC, "image": "containers/scalestudy.sif", "apptainer_args": ["--nv"]}
    prefix = nsys.profile_prefix("out/nsys", nsys.rank_variable("srun"))
    argv = launch.build_command(spec, ["--out-dir", "out"], rank_prefix=prefix, environ={}, workdir="/w")
    assert argv[0] == "srun"
    positions = [
        index_of(argv, word)
        for word in ("srun", "apptainer", "/w/containers/scalestudy.sif", "nsys", "scalestudy.train")
    ]
    assert positions == sorted(positions), argv
    assert argv[index_of(argv, "nsys") + 1] == "profile"


def test_nsys_under_torchrun_names_reports_by_torchrun_rank():
    spec = {"launcher": "local", "world_size": 2}
    prefix = nsys.profile_prefix("out/nsys", nsys.rank_variable("local"))
    argv = launch.build_command(spec, ["--out-dir", "out"], rank_prefix=prefix, environ={})
    assert "--no-python" in argv and argv.index("--no-python") < argv.index("nsys")
    assert prefix[-1].endswith("_r%q{RANK}")


def test_launch_cli_receives_the_prefix_from_the_profile_run(monkeypatch):
    prefix = nsys.profile_prefix("out/nsys", "SLURM_PROCID")
    argv = run.launch_argv(SPEC, RUN, "out", prefix)
    assert argv[1:3] == ["-m", "scalestudy.launch"]
    options = argv[3:]
    options.insert(options.index("--"), "--dry-run")
    command, _, dry_run = launch.prepare(options, {"SLURM_JOB_ID": "7", "PATH": ""})
    assert dry_run and command[0] == "srun"
    assert command[index_of(command, "nsys") :][:2] == ["nsys", "profile"]
    trainer = command[command.index("--run-config-json") + 1]
    assert json.loads(trainer) == RUN


def test_rank_variable_follows_the_launcher(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "12")
    monkeypatch.delenv("SLURM_STEP_ID", raising=False)
    assert nsys.rank_variable(run.launcher_kind({"world_size": 2})) == "SLURM_PROCID"
    monkeypatch.delenv("SLURM_JOB_ID")
    assert nsys.rank_variable(run.launcher_kind({"world_size": 2})) == "RANK"


def test_nsys_stats_command_and_output_names():
    command = nsys.stats_command("nsys/7_r1.nsys-rep", nsys.stats_prefix("stats", 1))
    assert command[:2] == ["nsys", "stats"] and command[-1] == "nsys/7_r1.nsys-rep"
    assert (
        command[command.index("--report") + 1]
        == "cuda_gpu_kern_sum,cuda_gpu_mem_time_sum,nvtx_sum,cuda_gpu_trace"
    )
    assert command[command.index("--format") + 1] == "csv"
    assert command[command.index("--output") + 1] == "stats/r1"
    assert nsys.stats_csv("stats", 1, nsys.KERNELS) == Path("stats/r1_cuda_gpu_kern_sum.csv")


def test_one_report_per_rank(tmp_path):
    for rank in (0, 1):
        (tmp_path / f"4711_r{rank}.nsys-rep").touch()
    assert nsys.rank_reports(tmp_path, 2) == {r: tmp_path / f"4711_r{r}.nsys-rep" for r in (0, 1)}
    with pytest.raises(FileNotFoundError, match="rank 2: 0 reports"):
        nsys.rank_reports(tmp_path, 3)
    single = tmp_path / "single"
    single.mkdir()
    (single / "_r.nsys-rep").touch()  # one plain process: no rank variable set
    assert nsys.rank_reports(single, 1) == {0: single / "_r.nsys-rep"}


def test_nsys_export_of_a_torch_run_says_so(tmp_path):
    record = tmp_path / "profile_tool.json"
    record.write_text(json.dumps({"tool": "torch", "world_size": 1}))
    assert nsys.main(["export", "--record", str(record), "--out-dir", str(tmp_path / "stats")]) == 0
    status = json.loads((tmp_path / "stats" / "status.json").read_text())
    assert status["exported"] is False and "torch" in status["reason"]


def test_nsys_export_without_nsys_binary_fails_clearly(tmp_path):
    record = {"tool": "nsys", "evidence": {"nsys_reports": {"0": "x_r0.nsys-rep"}}}
    with pytest.raises(FileNotFoundError, match="not on PATH"):
        nsys.export(record, tmp_path, nsys="no-such-nsys-binary")


# --- ncu -------------------------------------------------------------------------------------------


def test_ncu_profiles_named_kernels_inside_the_step_ranges_of_the_steady_window():
    prefix = ncu.profile_prefix("w/profile", "regex:^(sm80|void)", 40)
    assert prefix[0] == "ncu"
    pairs = {prefix[i]: prefix[i + 1] for i in range(1, len(prefix) - 1) if prefix[i].startswith("--")}
    assert pairs["--target-processes"] == "all"
    # nothing before the trainer's cudaProfilerStart (the profile window) is profiled ...
    assert pairs["--profile-from-start"] == "off"
    # ... and of that only kernels inside the NVTX "step" ranges the trainer pushes (scalestudy.train.ranges)
    assert "--nvtx" in prefix and pairs["--nvtx-include"] == STEP_RANGE == "step"  # start/end, not "step/"
    # ... and outside the loader's "data" ranges, unless the config asks for its kernels
    assert pairs["--nvtx-exclude"] == DATA_RANGE == "data"
    assert "--nvtx-exclude" not in ncu.profile_prefix("w/profile", "regex:.*", 40, loader_kernels=True)
    assert pairs["--kernel-name-base"] == "function" and pairs["--kernel-name"] == "regex:^(sm80|void)"
    assert pairs["--launch-count"] == "40" and "--launch-skip" not in prefix
    assert pairs["--set"] == "basic" and pairs["--clock-control"] == "none"
    assert pairs["--export"] == "w/profile"
    assert ncu.export_command("w/profile.ncu-rep") == [
        "ncu",
        "--import",
        "w/profile.ncu-rep",
        "--csv",
        "--page",
        "raw",
        "--print-units",
        "base",
    ]


def test_the_nvtx_range_ncu_filters_on_is_one_the_trainer_pushes_around_each_step():
    """ncu's --nvtx-include names a range by string: it must be the trainer's (scalestudy.train.ranges)."""
    import ast

    tree = ast.parse(
        (Path(__file__).resolve().parent.parent / "scalestudy" / "train" / "trainer.py").read_text()
    )
    pushed = {
        node.args[0].value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", getattr(node.func, "attr", None)) == "named_range"
        and node.args
        and isinstance(node.args[0], ast.Constant)
    }
    assert {STEP_RANGE, DATA_RANGE} <= pushed, pushed


def test_the_ncu_run_opens_its_window_with_the_cuda_profiler_api():
    run_config = ncu.ncu_run_config({**RUN, "world_size": 1})
    assert run_config["profile"] == {"tool": "nsys", "start_step": 2, "steps": 2}
    assert run_config["checkpoint_dir"] == "results/checkpoints/profile/ncu_w1"


def test_a_removed_ncu_setting_is_refused_saying_what_replaced_it():
    ncu.check_settings({"enabled": True, "launch_count": 40})
    with pytest.raises(
        ValueError, match=r"profiling.ncu.launch_skip \(3000\) is no longer used.*NVTX 'step'"
    ):
        ncu.check_settings({"launch_skip": 3000})


def test_ncu_goes_inside_the_one_rank():
    prefix = ncu.profile_prefix("w/profile", "regex:.*", 40)
    argv = launch.build_command(
        {"launcher": "srun", "world_size": 1}, ["--out-dir", "w/run"], rank_prefix=prefix, environ={}
    )
    assert argv[0] == "srun" and argv.index("ncu") < index_of(argv, "scalestudy.train")


def test_ncu_without_gpu_writes_plain_not_run_outputs(tmp_path, monkeypatch):
    monkeypatch.setattr(ncu, "find_binary", lambda name, image=None: (True, f"/usr/bin/{name}"))
    monkeypatch.setattr(ncu, "find_gpu", lambda: (False, "no CUDA GPU (nvidia-smi not found)"))
    outputs = {name: tmp_path / f"ncu_{name}" for name in ("status", "kernels", "raw")}
    args = [
        "run",
        "--launch-json",
        json.dumps({"world_size": 1}),
        "--run-config-json",
        json.dumps({**RUN, "world_size": 1}),
    ]
    args += ["--work-dir", str(tmp_path / "work")] + [f"--{k}={v}" for k, v in outputs.items()]
    assert ncu.main(args) == 0
    status = json.loads(outputs["status"].read_text())
    assert status == {"ran": False, "reason": "no CUDA GPU (nvidia-smi not found)", "kernels": 0}
    assert outputs["kernels"].read_text().strip() == ",".join(ncu.NCU_COLUMNS)
    assert "gpu__time_duration.sum" in outputs["raw"].read_text()


def test_ncu_refuses_a_multi_gpu_run():
    with pytest.raises(ValueError, match="one-GPU run"):
        ncu.availability({"world_size": 2}, {}, "ncu")


def test_ncu_counter_permission_error_is_recognised():
    lines = [
        "==PROF== Connected to process 5",
        "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission",
    ]
    assert ncu.counter_problem(lines).startswith("ERR_NVGPUCTRPERM")
    assert ncu.counter_problem(["==PROF== Disconnected from process 5"]) is None


# --- tool choice -----------------------------------------------------------------------------------


def yes(detail="found"):
    return lambda: (True, detail)


def no(detail):
    return lambda: (False, detail)


def test_auto_picks_nsys_only_with_nsys_and_a_gpu():
    assert tool.resolve("auto", "cuda", yes(), yes()).tool == "nsys"
    without_nsys = tool.resolve("auto", "auto", no("nsys not found on PATH"), yes())
    assert without_nsys.tool == "torch" and "nsys not found on PATH" in without_nsys.reason
    without_gpu = tool.resolve("auto", "auto", yes(), no("no CUDA GPU (nvidia-smi -L lists none)"))
    assert without_gpu.tool == "torch" and "no CUDA GPU" in without_gpu.reason
    on_cpu = tool.resolve("auto", "cpu", yes(), yes())
    assert on_cpu.tool == "torch" and "CPU" in on_cpu.reason


def test_explicit_tools():
    assert tool.resolve("torch", "cuda", yes(), yes()).tool == "torch"
    with pytest.raises(tool.ToolUnavailable, match="profiling.tool is nsys, but nsys not found"):
        tool.resolve("nsys", "cuda", no("nsys not found on PATH"), yes())
    with pytest.raises(ValueError, match="unknown profiling tool"):
        tool.resolve("perf", "cuda", yes(), yes())


def test_find_binary_on_path():
    assert tool.find_binary(Path(sys.executable).name)[0] is True
    assert tool.find_binary("no-such-profiler-binary") == (False, "no-such-profiler-binary not found on PATH")


# --- the profile run: the record only claims what ran ----------------------------------------------


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def fake_trainer(monkeypatch, writes, code=0):
    """Replace the launcher: record the argv, write `writes(out_dir, argv)`, exit with `code`."""
    calls = []

    def streaming(argv, keep_lines=200):
        calls.append(argv)
        out_dir = Path(argv[argv.index("--out-dir") + 1])
        out_dir.mkdir(parents=True, exist_ok=True)
        writes(out_dir, argv)
        return code, []

    monkeypatch.setattr(run, "run_streaming", streaming)
    return calls


def use_tool(monkeypatch, name):
    monkeypatch.setattr(
        run, "resolve_for", lambda r, s, b: tool.Resolution(r["profile"]["tool"], name, "test")
    )


def test_torch_run_is_recorded_with_its_files(in_tmp, monkeypatch):
    use_tool(monkeypatch, "torch")
    calls = fake_trainer(monkeypatch, lambda out, argv: [(out / n).write_text("x") for n in run.TORCH_FILES])
    checkpoint = in_tmp / RUN["checkpoint_dir"]
    checkpoint.mkdir(parents=True)
    code, record = run.profile_run({"world_size": 2}, RUN, in_tmp / "run")
    assert code == 0 and record["tool"] == "torch" and record["requested"] == "auto"
    assert set(record["evidence"]) == {"profile_ops", "profile_window"}
    trainer_run = json.loads(calls[0][calls[0].index("--run-config-json") + 1])
    assert trainer_run["profile"]["tool"] == "torch"  # the trainer gets the resolved tool
    assert json.loads(calls[0][calls[0].index("--rank-prefix-json") + 1]) == []
    assert not checkpoint.exists()  # a resumed run would skip the window


def test_a_run_without_profiler_output_is_not_recorded(in_tmp, monkeypatch):
    use_tool(monkeypatch, "torch")
    fake_trainer(monkeypatch, lambda out, argv: None)
    with pytest.raises(FileNotFoundError, match="profile_ops.csv"):
        run.profile_run({"world_size": 2}, RUN, in_tmp / "run")


def test_stale_profiler_output_does_not_count(in_tmp, monkeypatch):
    use_tool(monkeypatch, "torch")
    out = in_tmp / "run"
    out.mkdir()
    for name in run.TORCH_FILES:
        (out / name).write_text("from an earlier run")
    fake_trainer(monkeypatch, lambda out, argv: None)
    with pytest.raises(FileNotFoundError):
        run.profile_run({"world_size": 2}, RUN, out)


def test_nsys_run_passes_the_prefix_and_needs_every_rank_report(in_tmp, monkeypatch):
    use_tool(monkeypatch, "nsys")
    monkeypatch.setattr(run, "launcher_kind", lambda spec: "srun")

    def reports(out, argv):
        for rank in range(2):
            (out / "nsys" / f"99_r{rank}.nsys-rep").touch()

    calls = fake_trainer(monkeypatch, reports)
    code, record = run.profile_run({"world_size": 2}, RUN, in_tmp / "run")
    prefix = json.loads(calls[0][calls[0].index("--rank-prefix-json") + 1])
    assert prefix[:2] == ["nsys", "profile"] and prefix[-1].endswith("%q{SLURM_PROCID}")
    assert code == 0 and record["tool"] == "nsys" and sorted(record["evidence"]["nsys_reports"]) == ["0", "1"]
    spec = json.loads(calls[0][calls[0].index("--launch-json") + 1])
    assert spec["env"]["TMPDIR"] == str(in_tmp / "run" / "nsys" / "tmp")  # this job's own, not /tmp
    assert not (in_tmp / "run" / "nsys" / "tmp").exists()
    fake_trainer(monkeypatch, lambda out, argv: (out / "nsys" / "99_r0.nsys-rep").touch())
    with pytest.raises(FileNotFoundError, match="rank 1: 0 reports"):
        run.profile_run({"world_size": 2}, RUN, in_tmp / "run")


def test_a_failed_training_run_passes_its_exit_code_on(in_tmp, monkeypatch):
    use_tool(monkeypatch, "torch")
    fake_trainer(monkeypatch, lambda out, argv: None, code=75)
    assert run.profile_run({"world_size": 2}, RUN, in_tmp / "run") == (75, None)


def test_checkpoints_outside_the_profile_stage_are_never_cleared(in_tmp):
    with pytest.raises(ValueError, match="refusing to clear"):
        run.clear_checkpoints({"checkpoint_dir": "results/checkpoints/scaling/strong/w2_r0"})


def test_cli_writes_the_record(in_tmp, monkeypatch):
    use_tool(monkeypatch, "torch")
    fake_trainer(monkeypatch, lambda out, argv: [(out / n).write_text("x") for n in run.TORCH_FILES])
    record = in_tmp / "run" / "profile_tool.json"
    args = ["--launch-json", json.dumps({"world_size": 2}), "--run-config-json", json.dumps(RUN)]
    assert run.main([*args, "--out-dir", str(in_tmp / "run"), "--record", str(record)]) == 0
    assert json.loads(record.read_text())["tool"] == "torch"


@pytest.mark.skipif(shutil.which("nsys") is not None, reason="nsys is installed here")
def test_auto_falls_back_to_torch_on_this_machine():
    resolution = run.resolve_for(RUN, {"world_size": 2}, "nsys")
    assert resolution.tool == "torch" and "nsys not found" in resolution.reason


def test_launcher_output_is_streamed_and_its_exit_code_returned():
    code, tail = run.run_streaming([sys.executable, "-c", "print('a'); print('b'); raise SystemExit(3)"])
    assert (code, tail) == (3, ["a", "b"])


def test_a_checkpoint_signal_reaches_the_launched_process():
    child = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGUSR1, lambda *_: sys.exit(75))\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )

    def ignore(*_):  # a signal sent too early must not kill the test run
        pass

    previous = signal.signal(signal.SIGUSR1, ignore)
    timer = threading.Timer(1.5, os.kill, (os.getpid(), signal.SIGUSR1))
    timer.start()
    try:
        code, tail = run.run_streaming([sys.executable, "-c", child])
        assert signal.getsignal(signal.SIGUSR1) is ignore  # the handler before the run is back
    finally:
        timer.cancel()
        signal.signal(signal.SIGUSR1, previous)
    assert (code, tail) == (75, ["ready"])


def ncu_options(tmp_path):
    args = ["run", "--launch-json", "{}", "--run-config-json", "{}", "--work-dir", str(tmp_path)]
    args += ["--kernel-regex", "regex:gemm", "--launch-count", "40"]
    args += [f"--{name}={tmp_path / name}" for name in ("status", "kernels", "raw")]
    return ncu._parser().parse_args(args)


def fake_ncu_environment(monkeypatch, lines, code=0):
    monkeypatch.setattr(ncu, "availability", lambda run, spec, binary: None)
    monkeypatch.setattr(ncu, "run_streaming", lambda argv, keep_lines=200: (code, lines))


def test_ncu_counter_errors_become_a_not_run_status(in_tmp, monkeypatch):
    fake_ncu_environment(monkeypatch, ["==ERROR== ERR_NVGPUCTRPERM - no permission"])
    run_config = {**RUN, "world_size": 1, "checkpoint_dir": "results/checkpoints/profile/w1"}
    code, status, rows, _ = ncu.profile({"world_size": 1}, run_config, in_tmp / "w", ncu_options(in_tmp))
    assert code == 0 and status["ran"] is False and "ERR_NVGPUCTRPERM" in status["reason"] and rows == []


def test_ncu_that_matched_nothing_ran_but_says_so(in_tmp, monkeypatch):
    fake_ncu_environment(monkeypatch, ["==WARNING== No kernels were profiled."])
    run_config = {**RUN, "world_size": 1, "checkpoint_dir": "results/checkpoints/profile/w1"}
    code, status, _, _ = ncu.profile({"world_size": 1}, run_config, in_tmp / "w", ncu_options(in_tmp))
    assert code == 0 and status["ran"] is True and status["kernels"] == 0
    assert (
        status["reason"]
        == "no report: no kernel matched 'regex:gemm' inside the NVTX 'step' ranges of steps 2..3"
    )


def test_the_ncu_and_nsys_runs_get_a_tmpdir_of_their_own(in_tmp, monkeypatch):
    seen = []
    monkeypatch.setattr(ncu, "availability", lambda run, spec, binary: None)
    monkeypatch.setattr(ncu, "run_streaming", lambda argv, keep_lines=200: seen.append(argv) or (0, []))
    run_config = {**RUN, "world_size": 1, "checkpoint_dir": "results/checkpoints/profile/w1"}
    ncu.profile({"world_size": 1, "env": {"A": "1"}}, run_config, in_tmp / "w", ncu_options(in_tmp))
    spec = json.loads(seen[0][seen[0].index("--launch-json") + 1])
    assert spec["env"] == {"A": "1", "TMPDIR": str(in_tmp / "w" / "tmp")}
    assert not (in_tmp / "w" / "tmp").exists()  # removed after the run


def test_a_training_failure_under_ncu_is_a_failure(in_tmp, monkeypatch):
    fake_ncu_environment(monkeypatch, ["Traceback ...", "RuntimeError: boom"], code=1)
    run_config = {**RUN, "world_size": 1, "checkpoint_dir": "results/checkpoints/profile/w1"}
    assert ncu.profile({"world_size": 1}, run_config, in_tmp / "w", ncu_options(in_tmp))[0] == 1


def test_the_profile_run_hands_the_log_and_attempt_to_the_launcher(tmp_path):
    """So a profile run retried after its time limit keeps every attempt's log, like training."""
    argv = run.launch_argv(SPEC, RUN, "out", [], ["--log", str(tmp_path / "w8.log"), "--attempt", "2"])
    options = argv[3 : argv.index("--")]
    assert options[options.index("--log") + 1] == str(tmp_path / "w8.log")
    assert options[options.index("--attempt") + 1] == "2"
    parsed, _ = launch.parse_args(argv[3:])
    assert parsed.attempt == 2 and parsed.log == str(tmp_path / "w8.log")


def test_the_ncu_run_hands_the_log_and_attempt_to_the_launcher(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(ncu, "availability", lambda *args: None)
    monkeypatch.setattr(ncu, "run_streaming", lambda argv: (seen.append(argv), (3, ""))[1])
    log = str(tmp_path / "ncu.log")
    options = ncu._parser().parse_args(
        ["run", "--launch-json", "{}", "--run-config-json", "{}", "--work-dir", str(tmp_path)]
        + ["--status", "s", "--kernels", "k", "--raw", "r", "--log", log, "--attempt", "2"]
    )
    one_gpu = {**SPEC, "world_size": 1, "nodes": 1, "tasks_per_node": 1, "gres": "gpu:1"}
    code, *_ = ncu.profile(one_gpu, {**RUN, "world_size": 1}, tmp_path, options)
    assert code == 3 and len(seen) == 1
    argv = seen[0][: seen[0].index("--")]
    assert argv[argv.index("--log") + 1] == log and argv[argv.index("--attempt") + 1] == "2"
