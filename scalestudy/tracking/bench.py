"""What live tracking costs a training job: `python -m scalestudy.tracking.bench [--pairs N]`.

Trains the demo's baseline point for `--epochs` (config/demo.yaml, one rank, on the packed data
the demo made in results/data/packed) with tracking off and on, in interleaved pairs (off, on, off,
on, ...) so that machine load hits both alike. On: the embedded SQLite store in a temporary folder
and the study's follower on the same cores, started before the job, which starts once the follower
has attached to the store (as every job of a study but the first does), and stopped once it has
replayed the job's journal. Prints the steady-state throughput (summary.json's images_per_s) and
wall time of each, with the medians and their ratio. docs/benchmarks.md holds the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from scalestudy import tracking
from scalestudy.plan import runfiles


def run_config(config_path: Path, data_dir: Path, checkpoint_dir: Path, epochs: int) -> dict:
    from scalestudy.plan import grid, schema

    config = yaml.safe_load(config_path.read_text())
    import snakemake.utils

    snakemake.utils.validate(config, str(schema.PATH))
    run = grid.run_config(config, grid.baseline_point(config))
    return {**run, "data_dir": str(data_dir), "checkpoint_dir": str(checkpoint_dir), "epochs": epochs}


def one(run: dict, out: Path, env: dict) -> tuple[float, float]:
    started = time.perf_counter()
    command = [sys.executable, "-m", "scalestudy.train", "--run-config-json", json.dumps(run)]
    subprocess.run([*command, "--out-dir", str(out)], env=env, check=True, capture_output=True)
    wall = time.perf_counter() - started
    return json.loads((out / runfiles.SUMMARY).read_text())["results"]["images_per_s"], wall


def follower_ready(settings: dict, logs: Path, runs: Path) -> None:
    """Starts the study's follower and waits until it has attached to the store."""
    from scalestudy.tracking import follow

    tracking.start_follower(settings, logs, [runs])
    deadline = time.monotonic() + 120
    log = logs / tracking.FOLLOWER_LOG
    while not log.is_file() or follow.FOLLOWING not in log.read_text(errors="replace"):
        if time.monotonic() > deadline:
            raise SystemExit(f"the follower did not start: {log}")
        time.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=1, help="the demo's window (21 steps) fits in one")
    parser.add_argument("--config", type=Path, default=Path("config/demo.yaml"))
    parser.add_argument("--data-dir", type=Path, default=Path("results/data/packed"))
    args = parser.parse_args(argv)
    base = {k: v for k, v in os.environ.items() if k != tracking.ENV and not k.startswith("APPTAINERENV_")}
    results: dict[str, list[tuple[float, float]]] = {"off": [], "on": []}
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        settings = tracking.settings({"study": {"name": "bench"}}, root)
        for index in range(args.pairs):
            for mode, extra in (("off", {}), ("on", tracking.to_environ(settings))):
                checkpoints = root / f"ckpt-{mode}-{index}"
                run = run_config(args.config, args.data_dir.resolve(), checkpoints, args.epochs)
                out = root / f"results/runs/{mode}/{index}"
                if extra:
                    follower_ready(settings, root / "logs", out.parent)
                results[mode].append(one(run, out, {**base, **extra}))
                if extra:
                    tracking.stop_follower(root / "logs" / tracking.FOLLOWER_PID)
                rate, wall = results[mode][-1]
                print(f"{mode} {index}: {rate:.1f} images/s, wall {wall:.1f} s", flush=True)
    medians = {
        mode: [statistics.median(v[i] for v in values) for i in (0, 1)] for mode, values in results.items()
    }
    for mode, (rate, wall) in medians.items():
        print(f"{mode}: median {rate:.1f} images/s, wall {wall:.1f} s")
    ratio, extra = medians["on"][0] / medians["off"][0], medians["on"][1] - medians["off"][1]
    print(f"on/off throughput {ratio:.4f}, wall {extra:+.1f} s per job")
    return 0


if __name__ == "__main__":
    sys.exit(main())
