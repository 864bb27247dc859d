"""The steady-state window with a fake clock: what it counts, what it leaves out, when it synchronises."""

import math

import pytest

from scalestudy.train import step_parts
from scalestudy.train.steady import SteadyWindow, interval_sizes, window_of_steps

IMAGES = 64  # images per step, all ranks


class FakeClock:
    """Time moves only when told; counts the device synchronisations asked for."""

    def __init__(self) -> None:
        self.now, self.syncs = 1000.0, 0

    def __call__(self) -> float:
        return self.now

    def sync(self) -> None:
        self.syncs += 1


def window(clock: FakeClock, warmup: int, steps: int, intervals: int) -> SteadyWindow:
    return SteadyWindow(
        warmup, steps, intervals, synchronize=clock.sync, clock=clock, wall=clock, t0=clock.now - 5.0
    )


def train(w: SteadyWindow, clock: FakeClock, steps: int, step_s=lambda i: 1.0, epoch_steps=12, pause_s=100.0):
    """`steps` steps of step_s(i) seconds; at every epoch end a pause of pause_s (evaluation)."""
    for i in range(steps):
        clock.now += step_s(i)
        w.step_done(IMAGES)
        if (i + 1) % epoch_steps == 0:
            with w.paused():
                clock.now += pause_s


@pytest.mark.parametrize(
    ("steps", "intervals", "sizes"),
    [(16, 4, [4, 4, 4, 4]), (10, 4, [3, 3, 2, 2]), (3, 4, [1, 1, 1]), (200, 1, [200])],
)
def test_interval_sizes(steps, intervals, sizes):
    assert interval_sizes(steps, intervals) == sizes
    assert sum(sizes) == steps


def test_a_window_longer_than_an_epoch_counts_steps_across_epochs_and_skips_the_pauses():
    clock = FakeClock()
    w = window(clock, warmup=5, steps=16, intervals=4)
    w.start(global_step=0)
    first = {0: 30.0}  # the first step compiles
    train(w, clock, 36, step_s=lambda i: first.get(i, 1.0))  # 3 epochs of 12 steps
    r = w.result(world_size=2)
    assert r["window_filled"] and r["measured_steps"] == 16 and r["warmup_steps"] == 5
    assert r["measured_s"] == pytest.approx(16.0)  # the epoch-end pauses at steps 12 are left out
    assert r["images_per_s"] == pytest.approx(16 * IMAGES / 16.0)
    assert r["images_per_s_per_gpu"] == pytest.approx(IMAGES / 2)
    assert r["step_time_s"] == pytest.approx(1.0)
    assert r["first_step_s"] == pytest.approx(30.0)
    assert r["measure_start_step"] == 5
    # seconds since t0 (5 s before the start): 30 + 4 steps, then 16 steps + one 100 s pause
    assert r["measure_start_s"] == pytest.approx(5 + 34)
    assert r["measure_end_s"] == pytest.approx(5 + 34 + 16 + 100)
    assert r["images_per_s_min"] == r["images_per_s_max"] == pytest.approx(IMAGES)
    assert r["images_per_s_cv"] == pytest.approx(0.0)


def test_the_window_records_its_unpaused_segments_for_the_monitor():
    clock = FakeClock()
    w = window(clock, warmup=5, steps=16, intervals=4)  # t0 = 995: wall times below are + 5
    w.start(global_step=0)
    train(w, clock, 36)  # warm-up ends at step 5; an epoch end (pause of 100 s) after step 12
    r = w.result(world_size=1)
    # 7 steps (6..12) before the pause, then 9 steps (13..21) after it
    assert r["measure_segments_s"] == [[10.0, 17.0], [117.0, 126.0]]
    assert (r["measure_start_s"], r["measure_end_s"]) == (10.0, 126.0)
    segments_s = sum(end - start for start, end in r["measure_segments_s"])
    assert segments_s == pytest.approx(r["measured_s"])  # the same stretches as the throughput


def test_the_spread_is_that_of_the_sub_intervals():
    clock = FakeClock()
    w = window(clock, warmup=0, steps=8, intervals=2)
    w.start(global_step=40)
    train(w, clock, 8, step_s=lambda i: 1.0 if i < 4 else 3.0, epoch_steps=100)
    r = w.result(world_size=1)
    rates = [4 * IMAGES / 4.0, 4 * IMAGES / 12.0]
    assert r["interval_images_per_s"] == pytest.approx(rates)
    assert (r["images_per_s_min"], r["images_per_s_max"]) == pytest.approx((min(rates), max(rates)))
    mean = sum(rates) / 2
    assert r["images_per_s_cv"] == pytest.approx(math.sqrt(sum((x - mean) ** 2 for x in rates)) / mean)
    assert r["images_per_s"] == pytest.approx(8 * IMAGES / 16.0)  # all images over all the time
    assert r["measure_start_step"] == 40


def test_a_run_too_short_says_so_and_gives_no_rate():
    clock = FakeClock()
    w = window(clock, warmup=5, steps=16, intervals=4)
    w.start(global_step=0)
    train(w, clock, 12)
    r = w.result(world_size=1)
    assert not r["window_filled"]
    assert r["measured_steps"] == 7 and r["measure_end_s"] is None
    assert r["images_per_s"] is None and r["step_time_s"] is None and r["images_per_s_min"] is None


def test_the_device_is_synchronised_at_edges_only_never_per_step():
    counts = []
    for steps in (40, 400):
        clock = FakeClock()
        w = window(clock, warmup=5, steps=steps, intervals=4)
        w.start(global_step=0)
        train(w, clock, steps + 5, epoch_steps=10**6)
        assert w.filled
        counts.append(clock.syncs)
    # start, after the first step, window open, 4 interval ends: the same for 40 and 400 steps
    assert counts == [7, 7]


def test_pauses_outside_the_window_cost_no_synchronisation():
    clock = FakeClock()
    w = window(clock, warmup=20, steps=4, intervals=1)
    w.start(global_step=0)
    before = clock.syncs
    with w.paused():
        clock.now += 50
    assert clock.syncs == before and not w.measuring


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="steps >= 1"):
        SteadyWindow(5, 0, 4)


# --- grid points that cannot fill their window (scalestudy.plan.grid.window_problems) -------------------


def _study(name: str) -> dict:
    from scalestudy.plan.studyconfig import load as load_config
    from tests.conftest import REPO

    return load_config(REPO / "config" / name)


@pytest.mark.parametrize("name", ["config.yaml", "demo.yaml"])
def test_every_point_of_the_shipped_studies_fills_its_window(name):
    from scalestudy.plan import grid

    assert grid.window_problems(_study(name)) == []


def test_a_point_too_short_for_its_window_is_named_with_its_arithmetic():
    from scalestudy.plan import grid

    config = _study("config.yaml")
    config["train"]["epochs"] = 20  # weak scaling at 16 GPUs: 50000/16/256 = 12 steps x 20 = 240 < 250
    problems = grid.window_problems(config)
    assert problems == [
        f"results/runs/scaling/weak/w16_r{r}: 20 epochs x 12 steps = 240 steps (needs 21 epochs, "
        "train.epochs) cannot fill the measurement window of 250 (train.measure warmup_steps + steps)"
        for r in range(3)
    ]
    config["sensitivity"]["epochs"] = 2  # batch 512 at 8 GPUs: 12 steps per epoch
    assert (
        "results/runs/sensitivity/bf16/bs512_bucket25: 2 epochs x 12 steps = 24 steps (needs 21 epochs, "
        "sensitivity.epochs)" in "\n".join(grid.window_problems(config))
    )


def test_the_run_config_carries_the_window_and_the_inductor_cache():
    from scalestudy.plan import grid

    config = _study("config.yaml")
    run = grid.run_config(config, grid.baseline_point(config))
    assert (run["measure_warmup_steps"], run["measure_steps"], run["measure_intervals"]) == (50, 200, 4)
    assert run["compile"] is False and "inductor_cache_dir" not in run  # the baseline: eager
    run = grid.run_config(config, grid.scaling_points(config)[0])  # a compiled point: its own cache
    assert (
        run["compile"] is True and run["inductor_cache_dir"] == "results/inductor-cache/scaling/strong/w1_r0"
    )
    demo = _study("demo.yaml")
    run = grid.run_config(demo, grid.sensitivity_points(demo)[0])
    assert (run["measure_warmup_steps"], run["measure_steps"]) == (5, 16) and "inductor_cache_dir" not in run


# --- a window in seconds (train.measure.seconds) ------------------------------------------------------


def clocked_window(clock: FakeClock, warmup: int, steps: int, intervals: int, **kwargs) -> SteadyWindow:
    """A window timed by the fake clock (its sync, step clock and wall clock)."""
    return SteadyWindow(
        warmup, steps, intervals, synchronize=clock.sync, clock=clock, wall=clock, t0=clock.now, **kwargs
    )


def seconds_window(clock: FakeClock, warmup: int, steps: int, intervals: int, seconds: float, agree=None):
    kwargs = {"agree": agree} if agree else {}
    return clocked_window(clock, warmup, steps, intervals, min_seconds=seconds, **kwargs)


def test_a_window_in_seconds_plans_its_steps_from_the_warm_ups_rate():
    clock = FakeClock()
    agreed = []
    w = seconds_window(clock, 2, 4, 2, 10.0, agree=lambda s: agreed.append(s) or s)
    w.start(global_step=100)
    train(w, clock, 40, epoch_steps=10**6)
    r = w.result(world_size=1)
    # the warm-up's second step took 1 s: 10 s x 1.05 at 1 step/s = 11 steps, planned as it opens
    assert agreed == [1.0, 11.0] and r["measure_extensions"] == 0 and r["measure_seconds"] == 10.0
    assert r["window_filled"] and (r["measure_steps"], r["measured_steps"]) == (11, 11)
    assert r["measured_s"] == pytest.approx(11.0) and r["measured_s"] >= 10.0
    assert r["measure_start_step"] == 100 + 2  # right after the warm-up: nothing discarded
    assert r["measure_start_s"] == pytest.approx(2.0) and r["measure_end_s"] == pytest.approx(13.0)
    assert r["measure_segments_s"] == [[2.0, 13.0]]
    assert len(r["interval_images_per_s"]) == 2  # [6, 5] steps: the configured intervals


def test_a_window_long_enough_in_steps_is_not_extended():
    clock = FakeClock()
    w = seconds_window(clock, 2, 4, 2, 3.0)
    w.start(global_step=0)
    train(w, clock, 10, epoch_steps=10**6)
    r = w.result(world_size=1)
    assert r["window_filled"] and r["measure_extensions"] == 0 and r["measured_steps"] == 4


def test_the_issue_41_point_fills_its_window_in_the_steps_it_has():
    """bf16 at batch 512 on one H100 (issue 41): ~13.5 ms a step after a slow start, 30 warm-up steps,
    100 steps and 2 s asked for, 390 steps in the run. Planned from the warm-up, the window is
    156 steps, over after step 186; with an epoch end (evaluation) in the warm-up left out."""
    clock = FakeClock()
    w = seconds_window(clock, 30, 100, 5, 2.0)
    w.start(global_step=0)
    slow = {0: 3.0, 1: 0.2, 2: 0.1}  # the first steps autotune and grow the allocator
    train(w, clock, 390, step_s=lambda i: slow.get(i, 0.0135), epoch_steps=20, pause_s=0.5)
    r = w.result(world_size=1)
    assert r["window_filled"] and r["measure_extensions"] == 0 and r["measure_start_step"] == 30
    assert r["measure_steps"] == math.ceil(2.0 * 1.05 / 0.0135) == 156 and r["measured_s"] >= 2.0
    assert r["images_per_s"] == pytest.approx(IMAGES / 0.0135)


def test_steps_faster_than_the_warm_up_extend_the_window_without_discarding_it():
    clock = FakeClock()
    w = seconds_window(clock, 4, 4, 2, 10.0)
    w.start(global_step=0)
    # warm-up steps 3-4 at 2 s: 6 steps planned (10.5 s at 2 s), run at 1 s: 6 s, then 5 more (11 x 1 s)
    train(w, clock, 40, step_s=lambda i: 2.0 if i < 4 else 1.0, epoch_steps=10**6)
    r = w.result(world_size=1)
    assert r["window_filled"] and r["measure_extensions"] == 1 and r["measure_start_step"] == 4
    assert r["measure_steps"] == r["measured_steps"] == 11 and r["measured_s"] == pytest.approx(11.0)
    assert len(r["interval_images_per_s"]) == 4  # [3, 3] planned, then [3, 2] added: none larger


def test_steps_that_keep_getting_faster_extend_the_window_again():
    clock = FakeClock()
    w = seconds_window(clock, 1, 4, 1, 10.0)  # one warm-up step: nothing to plan from
    w.start(global_step=0)
    train(w, clock, 60, step_s=lambda i: 1.0 if i < 5 else 0.5, epoch_steps=10**6)
    r = w.result(world_size=1)
    # 4 steps of 1 s -> 11 steps in all; 7 more at 0.5 s: 7.5 s -> 16 steps in all (10 s)
    assert (
        r["measure_extensions"] == 2 and r["measure_steps"] == 16 and r["measured_s"] == pytest.approx(10.0)
    )
    assert r["measure_start_step"] == 1


def test_ranks_with_different_clocks_agree_on_the_steps_and_end_together():
    """Each rank's window hands its seconds to `agree` (the trainer: the mean over ranks by an
    all-reduce); with the agreed value every rank plans the same steps, whatever its own clock said."""
    results = []
    for step_s in (1.0, 1.2):
        clock = FakeClock()
        # the all-reduce's mean: the same steps at 1.1 s, the mean step time of the two ranks
        w = seconds_window(clock, 2, 4, 2, 10.0, agree=lambda s, own=step_s: s / own * 1.1)
        w.start(global_step=0)
        ended = None
        for i in range(40):
            clock.now += step_s
            w.step_done(IMAGES)
            if w.filled and ended is None:
                ended = i
        results.append((w.result(1)["measure_steps"], ended))
    assert results[0] == results[1] == (10, 2 + 10 - 1)  # ceil(10 x 1.05 / 1.1) = 10 steps from the warm-up
    clock = FakeClock()
    alone = seconds_window(clock, 2, 4, 2, 10.0)  # without agreeing, the slow rank would plan its own
    alone.start(global_step=0)
    train(alone, clock, 40, step_s=lambda i: 1.2, epoch_steps=10**6)
    assert alone.result(1)["measure_steps"] == 9  # ceil(10 x 1.05 / 1.2): the ranks would part


def test_the_window_in_seconds_of_reported_steps():
    """The command workload replays its script's steps through the same window."""
    r = window_of_steps([1.0] * 30, [IMAGES] * 30, 2, 4, 2, 1, min_seconds=10.0)
    assert r["window_filled"] and r["measure_extensions"] == 0 and r["measured_steps"] == 11
    assert r["measure_start_step"] == 2


def test_a_window_of_no_seconds_is_refused():
    with pytest.raises(ValueError, match="seconds must be positive"):
        SteadyWindow(5, 10, 2, min_seconds=0)


# --- windows too short for the GPU monitor, from the smoke test (scalestudy.plan.windowtime) -----------


def _smoke(folder, world: int, per_gpu_batch: int, step_s: float, steps=None, device="cuda") -> None:
    """A smoke test's record (its whole-run step time, first step included) and its timed steps."""
    import json

    record = {
        "world_size": world,
        "device": device,
        "step_time_s": step_s,
        "run_config": {"per_gpu_batch": per_gpu_batch},
    }
    (folder / f"train_w{world}.json").write_text(json.dumps(record))
    if steps is not None:
        (folder / f"train_w{world}").mkdir()
        rows = "".join(f"1,{i},,,,,{s}\n" for i, s in enumerate(steps))
        (folder / f"train_w{world}" / "steps.csv").write_text(
            "epoch,step,data_s,forward_s,backward_allreduce_s,optimizer_s,step_s\n" + rows
        )


def test_windows_too_short_for_the_gpu_monitor_are_named_from_the_smoke_tests_step_time(tmp_path):
    from scalestudy.plan import windowtime

    config = _study("config.yaml")
    assert windowtime.short_window_problems(config, tmp_path) == []  # no smoke test yet: no estimate
    # one GPU, the strong point's batch of 1024: the first step compiles (2 s), then 3 ms per step
    _smoke(tmp_path, 1, 1024, 0.5, steps=[2.0, 0.003, 0.003, 0.004])
    _smoke(tmp_path, 16, 64, 0.5)  # no timed steps: its record's step time, 0.5 s (long windows)
    assert windowtime.smoke_step_times(tmp_path) == {1: (0.003, 1024), 16: (0.5, 64)}
    problems = windowtime.short_window_problems(config, tmp_path)
    strong_1 = next(p for p in problems if p.startswith("results/runs/scaling/strong/w1_r0:"))
    # 200 steps x 3 ms = 0.6 s: 6 samples at 0.1 s, fewer than 10
    assert "about 0.6 s" in strong_1 and "6 GPU monitor samples at 0.1 s" in strong_1
    assert "min_window_samples=10; set train.measure.seconds to at least 1" in strong_1
    assert not any(p.startswith("results/runs/scaling/strong/w16_r0:") for p in problems)  # 100 s there
    config["train"]["measure"]["seconds"] = 1.5
    assert not any("GPU monitor samples" in p for p in windowtime.short_window_problems(config, tmp_path))
    config["train"]["measure"]["seconds"] = 60.0  # 21,000 steps of 3 ms: more than a run of 1 GPU has
    lines = windowtime.short_window_problems(config, tmp_path)
    weak_1 = next(p for p in lines if p.startswith("results/runs/scaling/weak/w1_r0:"))
    # weak w1: 50,000 / 256 = 195 steps an epoch; 50 warm-up + ceil(60 x 1.05 / 0.00075) = 84,050 steps
    assert "(needs 432 epochs, train.epochs) cannot fill a window of 60 s (50 warm-up steps + 84000" in weak_1
    assert "steps of 0.75 ms, the smoke test's step time at this batch)" in weak_1


def test_the_smoke_tests_step_time_is_its_fastest_after_the_first(tmp_path):
    """A few smoke steps still warm up (autotuning, allocator): the fastest is nearest the steady
    state, and a faster step means more steps needed for a window in seconds."""
    from scalestudy.plan import windowtime

    _smoke(tmp_path, 1, 256, 0.5, steps=[3.0, 0.009, 0.004, 0.006])
    assert windowtime.smoke_step_times(tmp_path) == {1: (0.004, 256)}


def test_a_smoke_test_on_the_cpu_gives_no_monitor_window_warning(tmp_path):
    from scalestudy.plan import windowtime

    _smoke(tmp_path, 1, 1024, 0.001, steps=[0.1, 0.001, 0.001], device="cpu")
    assert windowtime.short_window_problems(_study("config.yaml"), tmp_path) == []


# --- where the measured steps go (scalestudy.train.step_parts) -------------------------------------


class FakeEvent:
    """A CUDA event on the fake clock: record() notes the time, elapsed_time() is in milliseconds."""

    created = 0

    def __init__(self, clock: FakeClock) -> None:
        self.clock, self.at = clock, None
        FakeEvent.created += 1

    def record(self) -> None:
        self.at = self.clock.now

    def elapsed_time(self, end: "FakeEvent") -> float:
        return (end.at - self.at) * 1e3


def parted_window(clock: FakeClock, parts, warmup=2, steps=8, intervals=2, **kwargs) -> SteadyWindow:
    return clocked_window(clock, warmup, steps, intervals, parts=parts, **kwargs)


def train_parted(
    w: SteadyWindow, clock: FakeClock, steps: int, data_s=0.2, work_s=0.5, tail_s=0.1, host_s=0.05
):
    """Steps of data wait, own work, gradient wait (last gradient to backward's end), then host work
    between steps (after the step's last kernel, before the next step starts)."""
    for _ in range(steps):
        w.parts.step_started()
        clock.now += data_s
        w.parts.data_ready()
        clock.now += work_s
        w.parts.last_gradient()
        clock.now += tail_s
        w.parts.backward_done()
        w.step_done(IMAGES)
        clock.now += host_s


def test_host_clocks_give_the_data_and_gradient_wait_per_step_and_no_device_span():
    clock = FakeClock()
    parts = step_parts.StepParts(clock=clock)
    parts.hooked = True  # as attach() leaves it
    w = parted_window(clock, parts)
    w.start(global_step=0)
    train_parted(w, clock, 20)
    report = parts.report(w.result(1)["measured_s"], 8)
    assert report["step_s"] == pytest.approx(0.85)
    assert report["data_wait_s"] == pytest.approx(0.2) and report["gradient_wait_s"] == pytest.approx(0.1)
    assert report["device_busy_s"] is None  # no device timeline on the CPU: not a zero
    assert not parts.active  # the steps after the window add nothing
    unhooked = step_parts.StepParts(clock=clock)
    assert unhooked.report(1.0, 1)["gradient_wait_s"] is None  # FSDP2: no hook, not measured


def test_cuda_events_give_the_device_span_read_once_per_interval_without_a_synchronisation():
    clock = FakeClock()
    reads = []
    parts = step_parts.CudaStepParts(clock=clock, event_factory=lambda: FakeEvent(clock))
    parts.hooked = True
    original = parts.interval_closed
    parts.interval_closed = lambda: reads.append(clock.syncs) or original()
    FakeEvent.created = 0
    w = parted_window(clock, parts, steps=8, intervals=2)
    w.start(global_step=0)
    train_parted(w, clock, 20)
    assert w.filled and clock.syncs == 5  # start, first step, open, two interval ends: none more
    assert reads == [4, 5]  # read after each interval's synchronisation
    assert FakeEvent.created == 4 * 4  # four per step of the largest interval, made once
    report = parts.report(w.result(1)["measured_s"], 8)
    assert report["device_busy_s"] == pytest.approx(0.8)  # step start to its end: not the host work
    assert report["step_s"] - report["device_busy_s"] == pytest.approx(0.05)
    assert report["gradient_wait_s"] == pytest.approx(0.1) and report["data_wait_s"] == pytest.approx(0.2)


def test_an_extended_window_measures_its_parts_over_all_its_steps():
    clock = FakeClock()
    parts = step_parts.StepParts(clock=clock)
    w = parted_window(clock, parts, warmup=1, steps=2, intervals=1, min_seconds=5.0)
    w.start(global_step=0)
    train_parted(w, clock, 3, data_s=1.0)  # the window (2 steps of 1.65 s) is too short
    train_parted(w, clock, 30, data_s=0.1, work_s=1.4)  # as long a step, a shorter data wait
    r = w.result(1)
    assert r["measure_extensions"] == 1 and r["window_filled"] and r["measured_steps"] == 4
    assert parts.report(r["measured_s"], r["measured_steps"])["data_wait_s"] == pytest.approx(0.55)


def test_the_result_reports_every_ranks_parts_once_gathered():
    clock = FakeClock()
    w = parted_window(clock, step_parts.StepParts(clock=clock))
    w.start(global_step=0)
    train_parted(w, clock, 4)
    assert w.result(2)["step_parts"] is None  # not filled
    train_parted(w, clock, 10)
    assert w.result(2)["step_parts"] is None  # filled, not gathered
    other = {"step_s": 0.9, "data_wait_s": 0.3, "device_busy_s": None, "gradient_wait_s": None}
    w.gather_parts(lambda mine: [mine, other])
    gathered = w.result(2)["step_parts"]
    assert gathered["step_s"] == pytest.approx([0.85, 0.9])
    assert gathered["data_wait_s"] == pytest.approx([0.2, 0.3])
    assert gathered["device_busy_s"] is None and gathered["gradient_wait_s"] is None
