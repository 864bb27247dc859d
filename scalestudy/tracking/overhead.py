"""What live tracking costs a training job: `python -m scalestudy.tracking.overhead [--pairs N]`.

Trains the demo's baseline point for `--epochs` (config/demo.yaml, one rank, on the packed data
the demo made in results/data/packed) with tracking off and on, in interleaved pairs (off, on, off,
on, ...) so that machine load hits both alike. On: the embedded SQLite store in a temporary folder
and the study's follower on the same cores, started before the job, which starts once the follower
has attached to the store (as every job of a study but the first does), and stopped once it has
replayed the job's journal. Prints the steady-state throughput (summary.json's images_per_s) and
wall time of each, with the medians and their ratio; and, since on a shared 2-core guest the
throughput of two runs of the SAME job differs by more than the 1 % asked of tracking, the CPU time
the follower spent while the job trained (first to last logged step) as a share of the job's own
CPU time in that time (/proc): the most tracking can take from the job's steady state.
docs/guide/benchmarks.md holds the numbers.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scalestudy import commandline, tracking
from scalestudy.plan import runfiles
from scalestudy.train.journal import JOURNAL


def run_config(config_path: Path, data_dir: Path, checkpoint_dir: Path, epochs: int) -> dict:
    """The demo's baseline point's run config, on `data_dir`, for `epochs`."""
    from scalestudy.plan import grid, studyconfig

    config = studyconfig.load(config_path)
    run = grid.run_config(config, grid.baseline_point(config))
    return {**run, "data_dir": str(data_dir), "checkpoint_dir": str(checkpoint_dir), "epochs": epochs}


def one(run: dict, out: Path, env: dict, follower: int | None = None) -> dict[str, float]:
    """One training job: its steady-state images/s, wall and CPU seconds (all its threads, sampled
    every 50 ms from /proc: the last sample); with a follower's pid,
    the share of CPU the follower took while the job trained (first to last logged step)."""
    started = time.perf_counter()
    command = [sys.executable, "-m", "scalestudy.train", "--run-config-json", json.dumps(run)]
    samples = []  # (time, the job's CPU s, the follower's CPU s)
    with tempfile.TemporaryFile() as errors:  # not a pipe: its progress log would fill one
        job = subprocess.Popen(
            [*command, "--out-dir", str(out)], env=env, stdout=subprocess.DEVNULL, stderr=errors
        )
        while job.poll() is None:
            with contextlib.suppress(OSError, IndexError, ValueError):
                samples.append(
                    (time.time(), process_cpu_s(job.pid), process_cpu_s(follower) if follower else 0.0)
                )
            time.sleep(0.05)
        if job.returncode != 0:
            errors.seek(0)
            raise SystemExit(f"the training job failed:\n{errors.read().decode(errors='replace')[-3000:]}")
    result = {
        "rate": json.loads((out / runfiles.SUMMARY).read_text())["results"]["images_per_s"],
        "wall": time.perf_counter() - started,
        "cpu": samples[-1][1] if samples else float("nan"),  # to its last sample
    }
    if follower:
        result["share"] = training_share(samples, out / JOURNAL)
    return result


def training_share(samples: list[tuple[float, float, float]], journal: Path) -> float:
    """The follower's CPU over the job's, between the job's first and last logged step."""
    stamps = [json.loads(line)["at"][2] for line in journal.read_text().splitlines() if '"step"' in line]
    inside = [sample for sample in samples if stamps[0] <= sample[0] <= stamps[-1]]
    (_, job_0, follower_0), (_, job_1, follower_1) = inside[0], inside[-1]
    return (follower_1 - follower_0) / (job_1 - job_0)


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a running process, all its threads (/proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def follower_ready(settings: dict, logs: Path, runs: Path) -> int:
    """Starts the study's follower and waits until it has attached to the store; its pid."""
    from scalestudy.tracking import follow

    log = logs / tracking.FOLLOWER_LOG
    earlier = log.stat().st_size if log.is_file() else 0  # earlier followers' lines
    pid = tracking.start_follower(settings, logs, [runs])
    deadline = time.monotonic() + 120
    while not log.is_file() or follow.FOLLOWING not in log.read_text(errors="replace")[earlier:]:
        if time.monotonic() > deadline:
            raise SystemExit(f"the follower did not start: {log}")
        time.sleep(0.1)
    return pid


def main(argv: list[str] | None = None) -> int:
    parser = commandline.parser(__doc__)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=1, help="the demo's window (21 steps) fits in one")
    parser.add_argument("--config", type=Path, default=Path("config/demo.yaml"))
    parser.add_argument("--data-dir", type=Path, default=Path("results/data/packed"))
    args = parser.parse_args(argv)
    base = {k: v for k, v in os.environ.items() if k != tracking.ENV and not k.startswith("APPTAINERENV_")}
    results: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        settings = tracking.settings({"study": {"name": "bench"}}, root)
        given = run_config(args.config, args.data_dir.resolve(), root, args.epochs)
        for index in range(args.pairs):
            for mode in ("off", "on"):
                run = given | {"checkpoint_dir": str(root / f"ckpt-{mode}-{index}")}
                out = root / f"results/runs/{mode}/{index}"
                if mode == "off":
                    results[mode].append(one(run, out, base))
                else:
                    pid = follower_ready(settings, root / "logs", out.parent)
                    results[mode].append(one(run, out, {**base, **tracking.to_environ(settings)}, pid))
                    tracking.stop_follower(root / "logs" / tracking.FOLLOWER_PID)
                got = results[mode][-1]
                line = f"{mode} {index}: {got['rate']:.1f} images/s, wall {got['wall']:.1f} s"
                line += f", CPU {got['cpu']:.1f} s"
                if "share" in got:
                    line += f", follower {100 * got['share']:.2f} % of its CPU while it trained"
                print(line, flush=True)
    report(results)
    return 0


def report(results: dict[str, list[dict[str, float]]]) -> None:
    rate = {mode: statistics.median(r["rate"] for r in runs) for mode, runs in results.items()}
    for mode, runs in results.items():
        rates = [r["rate"] for r in runs]
        spread = (max(rates) - min(rates)) / rate[mode]
        wall = statistics.median(r["wall"] for r in runs)
        print(
            f"{mode}: median {rate[mode]:.1f} images/s (runs spread {100 * spread:.0f} %), wall {wall:.1f} s"
        )
    pairs = [on["rate"] / off["rate"] for off, on in zip(results["off"], results["on"], strict=True)]
    print(
        f"on/off throughput {rate['on'] / rate['off']:.4f}"
        f" (median of the pairs' ratios {statistics.median(pairs):.4f})"
    )
    extra = statistics.median(r["wall"] for r in results["on"]) - statistics.median(
        r["wall"] for r in results["off"]
    )
    print(f"wall {extra:+.1f} s per job")
    shares = [r["share"] for r in results["on"]]
    print(
        f"the follower's CPU while a job trained: median {100 * statistics.median(shares):.2f} %, "
        f"most {100 * max(shares):.2f} % of the job's CPU"
    )


if __name__ == "__main__":
    sys.exit(main())
