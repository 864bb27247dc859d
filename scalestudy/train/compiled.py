"""The compiled step (model.compile, issue 51): torch.compile's mode, its CUDA graphs, its cache.

- Mode: train.compile_mode `auto` is `reduce-overhead` on a GPU (Inductor records the compiled
  forward and backward as CUDA graphs and replays them: one launch instead of hundreds) and
  `default` on the CPU, which has no graphs, and under FSDP2.
- CUDA graphs: where the mode asks for them on a GPU, Inductor may still skip a graph and run it
  without one (pytorch issue 139207: DDP with BatchNorm, "skipping cudagraphs due to mutated
  inputs"), silently, at a fraction of the speed. The run counts the skips (Inductor's
  `cudagraph_skips` counter), keeps their reasons (the warning Inductor logs for each) and reports
  `cuda_graphs.skipped`, which the tables mark (scalestudy.analysis.graphs): such a point never
  passes as the fast step. With train.cuda_graphs_required the first skip fails the run instead
  (torch._inductor.config.triton.cudagraph_or_error).
- Cache: every run compiles into its own TORCHINDUCTOR_CACHE_DIR (inductor_cache_dir). The study's
  compile job of a compile key (scalestudy.plan.compilejobs) runs a few steps and saves what it
  compiled (torch.compiler.save_cache_artifacts: the FX graphs, AOTAutograd's graphs and, on a GPU,
  the Triton kernels) to `compile_cache_save`; each point of that key loads them
  (load_cache_artifacts, `compile_cache_load`) before it compiles, so it traces but compiles
  nothing. Whether it did is in summary.json: the cache's hits and misses over the run (Inductor's
  and AOTAutograd's counters), the load's seconds and, where the artifacts were made with another
  torch, Triton or device, why they were not loaded.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from scalestudy import atomic
from scalestudy.train import torch_options as torchopts

log = logging.getLogger("scalestudy.train")

AUTO = "auto"
GRAPH_MODES = ("reduce-overhead", "max-autotune")  # torch.compile's modes that record CUDA graphs
# The logger Inductor warns on for every skipped graph ("skipping cudagraphs due to ...": the
# artifact logger of torch._inductor.cudagraph_utils.log_cudagraph_skip_and_bump_counter).
SKIP_LOGGER = "torch._inductor.cudagraph_utils.__cudagraphs"
SKIP_PREFIX = "skipping cudagraphs"
# summary.json's compile.cache keys -> (counter group, counter) of torch._dynamo.utils.counters
CACHE_COUNTERS = {
    "fxgraph_hits": ("inductor", "fxgraph_cache_hit"),
    "fxgraph_misses": ("inductor", "fxgraph_cache_miss"),
    "aot_autograd_hits": ("aot_autograd", "autograd_cache_hit"),
    "aot_autograd_misses": ("aot_autograd", "autograd_cache_miss"),
}
SKIPS = ("inductor", "cudagraph_skips")
GRAPHS = ("stats", "unique_graphs")  # the graphs Dynamo captured (and handed to Inductor)
CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"


def resolve_mode(mode: str, device: torch.device, parallelism: str) -> str:
    """torch.compile's mode for `mode` on `device`: `auto` is reduce-overhead on a GPU, else default;
    under FSDP2 default too (it gathers each block's parameters into new memory every step, which a
    recorded graph cannot replay)."""
    if mode != AUTO:
        return mode
    return "reduce-overhead" if device.type == "cuda" and parallelism != "fsdp" else "default"


def graphs_expected(compile: bool, mode: str, device: torch.device, parallelism: str) -> bool:
    """The compiled step should run as CUDA graphs: compiled, in a graph mode, on a GPU."""
    return bool(compile) and device.type == "cuda" and resolve_mode(mode, device, parallelism) in GRAPH_MODES


def software() -> dict[str, Any]:
    """What compiled artifacts depend on: torch, Triton and the device (None on the CPU)."""
    try:
        triton = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        triton = None
    device = None
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        device = f"{torch.cuda.get_device_name()} (sm_{major}{minor})"
    return {"torch": torch.__version__, "triton": triton, "cuda": torch.version.cuda, "device": device}


class SkipReasons(logging.Handler):
    """Keeps the message of every CUDA graph Inductor skips (it warns once per skipped graph)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.reasons: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith(SKIP_PREFIX):
            self.reasons.append(message)


@dataclass(frozen=True)
class CompileSettings:
    """What the compiled step reads of its run config (from_config) and its device."""

    compile: bool
    mode: str  # resolved: never `auto`
    graphs_expected: bool
    graphs_required: bool  # train.cuda_graphs_required
    cache_dir: str | None  # inductor_cache_dir: TORCHINDUCTOR_CACHE_DIR
    cache_load: str | None  # compile_cache_load: artifacts to load before compiling
    cache_save: str | None  # compile_cache_save: where the compile job writes its artifacts

    @classmethod
    def from_config(cls, config: dict[str, Any], device: torch.device) -> CompileSettings:
        compiled, parallelism = bool(config["compile"]), config["parallelism"]
        return cls(
            compile=compiled,
            mode=resolve_mode(config["compile_mode"], device, parallelism),
            graphs_expected=graphs_expected(compiled, config["compile_mode"], device, parallelism),
            graphs_required=bool(config["cuda_graphs_required"]),
            cache_dir=config["inductor_cache_dir"],
            cache_load=config["compile_cache_load"],
            cache_save=config["compile_cache_save"],
        )


def counter_values() -> dict[str, int]:
    """Inductor's and AOTAutograd's cache counters and the CUDA graph skips, now (process-wide)."""
    from torch._dynamo.utils import counters

    pairs = {**CACHE_COUNTERS, "cudagraph_skips": SKIPS, "graphs": GRAPHS}
    return {name: int(counters[group][counter]) for name, (group, counter) in pairs.items()}


class CompiledStep:
    """One run's compiled step: `prepare` before the model is compiled (cache folder, artifacts,
    the skip recorder, the counters' start), `save` after the compile job's steps, `result` for
    summary.json, `close` at the end (the process-wide settings restored)."""

    def __init__(self, settings: CompileSettings) -> None:
        self.settings = settings
        self.start: dict[str, int] = {}
        self.artifacts: dict[str, Any] = {"path": settings.cache_load, "loaded": False, "load_s": None}
        self.skips = SkipReasons()
        self._or_error: bool | None = None
        self._cache_env: tuple[str | None] | None = None

    def prepare(self) -> None:
        if not self.settings.compile:
            return
        self._cache_env = (os.environ.get(CACHE_ENV),)
        torchopts.use_inductor_cache(self.settings.cache_dir)
        if self.settings.cache_load:
            self.artifacts.update(load_artifacts(Path(self.settings.cache_load)))
        self.start = counter_values()
        logging.getLogger(SKIP_LOGGER).addHandler(self.skips)
        if self.settings.graphs_required and self.settings.graphs_expected:
            import torch._inductor.config as inductor_config

            self._or_error = inductor_config.triton.cudagraph_or_error
            inductor_config.triton.cudagraph_or_error = True
        elif self.settings.graphs_required:
            log.warning(
                "cuda_graphs_required: no CUDA graphs to require (compile %s, mode %s, not on a GPU or "
                "not a graph mode)",
                self.settings.compile,
                self.settings.mode,
            )

    def counts(self) -> dict[str, int]:
        """The counters' change since prepare."""
        now = counter_values()
        return {name: now[name] - self.start.get(name, 0) for name in now}

    def save(self, compile_s: float) -> None:
        """The compile job's artifacts (torch.compiler.save_cache_artifacts), written atomically to
        compile_cache_save, with a record beside it (compile.json: the software they belong to, the
        compile's seconds and counters). Rank 0 only; nothing where this run saves none."""
        if not (self.settings.compile and self.settings.cache_save):
            return
        saved = torch.compiler.save_cache_artifacts()
        if saved is None:
            raise RuntimeError("torch.compiler.save_cache_artifacts: nothing was compiled to save")
        data, info = saved
        path = Path(self.settings.cache_save)
        atomic.write_bytes(path, data)
        record = {
            "software": software(),
            "mode": self.settings.mode,
            "compile_s": compile_s,
            "bytes": len(data),
            "artifacts": {kind: len(keys) for kind, keys in info.artifacts.items()},
            "counters": self.counts(),
        }
        atomic.write_json(record_path(path), record)
        log.info("compile cache: %d bytes of artifacts saved to %s", len(data), path)

    def result(self, compile_s: float | None) -> dict[str, Any]:
        """summary.json's `compile` and `cuda_graphs` (CUDA graphs' use); nothing without compile."""
        if not self.settings.compile:
            return {}
        counts = self.counts()
        cache = {name: counts[name] for name in CACHE_COUNTERS}
        skips, compiled_graphs = counts["cudagraph_skips"], counts["graphs"]
        expected = self.settings.graphs_expected
        graphs = {
            "expected": expected,
            "required": self.settings.graphs_required,
            "mode": self.settings.mode,
            "skips": skips,
            "skip_reasons": "; ".join(dict.fromkeys(self.skips.reasons)) or None,
            "used": (skips == 0 and compiled_graphs > 0) if expected else None,
            "skipped": expected and (skips > 0 or compiled_graphs == 0),
        }
        if graphs["skipped"]:
            log.warning(
                "CUDA graphs expected (mode %s) but %s: %s",
                self.settings.mode,
                f"{skips} skipped" if skips else "none compiled",
                graphs["skip_reasons"] or "no reason logged",
            )
        compiled = {
            "mode": self.settings.mode,
            "seconds": compile_s,
            "graphs": compiled_graphs,
            "cache": cache,
        }
        return {"compile": {**compiled, "artifacts": self.artifacts}, "cuda_graphs": graphs}

    def close(self) -> None:
        logging.getLogger(SKIP_LOGGER).removeHandler(self.skips)
        if self._cache_env is not None:  # the next run in this process (a test) chooses its own
            (previous,) = self._cache_env
            if previous is None:
                os.environ.pop(CACHE_ENV, None)
            else:
                os.environ[CACHE_ENV] = previous
            self._cache_env = None
        if self._or_error is not None:
            import torch._inductor.config as inductor_config

            inductor_config.triton.cudagraph_or_error = self._or_error
            self._or_error = None


def record_path(artifacts: Path) -> Path:
    """The record the compile job writes beside its artifacts."""
    return artifacts.with_name("compile.json")


def load_artifacts(path: Path) -> dict[str, Any]:
    """Loads the artifacts at `path` into this process's caches (the cache folder set before), unless
    their record says another torch, Triton or device made them; what happened, for summary.json."""
    if not path.exists():  # no compile job made them: the key has this run only (plan.compilejobs)
        log.info("compile cache: no artifacts at %s (no compile job for this key): compiling here", path)
        return {"loaded": False, "reason": f"no artifacts at {path}: no compile job (a key of one run)"}
    try:
        record = json.loads(record_path(path).read_text())
        data = path.read_bytes()
    except (OSError, ValueError) as error:
        log.warning("compile cache: %s not loaded (%s): compiling from scratch", path, error)
        return {"loaded": False, "reason": f"unreadable: {error}"}
    here = software()
    differ = {key: (record["software"].get(key), value) for key, value in here.items()}
    differ = {key: pair for key, pair in differ.items() if pair[0] != pair[1]}
    if differ:
        reason = "made with " + ", ".join(f"{key} {made} (here {now})" for key, (made, now) in differ.items())
        log.warning("compile cache: %s not loaded: %s", path, reason)
        return {"loaded": False, "reason": reason}
    started = time.perf_counter()
    torch.compiler.load_cache_artifacts(data)
    seconds = time.perf_counter() - started
    log.info("compile cache: loaded %s (%d bytes) in %.2f s", path, len(data), seconds)
    return {"loaded": True, "load_s": seconds, "reason": None, "compile_s_saved": record.get("compile_s")}
