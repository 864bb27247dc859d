"""The run configs the trainer's tests start from, one small deterministic run per workload; each
test module gives what it varies (its epochs, steps, checkpoint cadence, window, ...).

- resnet_run: ResNet-18 at width 8, 16 images a step on one rank, fp32 (the schema's default is
  bf16) in the contiguous layout, no warm-up, seed 0, deterministic, its checkpoints kept (the
  tests compare the finished runs' weights);
- lm_run: a 2-layer GPT of width 32 over 32 tokens (tokenized as tests/inprocess.write_packed_text
  writes them), 16 sequences a step on one rank, fp32, AdamW with the LM's clipping and decay.
"""

from __future__ import annotations

from typing import Any

RESNET = {
    "world_size": 1,
    "per_gpu_batch": 16,
    "global_batch": 16,
    "base_batch": 16,
    "width": 8,
    "precision": "fp32",
    "channels_last": False,
    "warmup_epochs": 0,
    "lr": 0.05,
    "seed": 0,
    "deterministic": True,
    "monitor_interval_s": 0.5,
    "keep_checkpoints": True,
}
GPT = {"layers": 2, "heads": 2, "d_model": 32, "seq_len": 32, "vocab_size": None}
LM = {
    "workload": "gpt",
    "gpt": GPT,
    "world_size": 1,
    "per_gpu_batch": 16,
    "global_batch": 16,
    "base_batch": 16,
    "precision": "fp32",
    "lr": 0.003,
    "weight_decay": 0.1,
    "grad_clip": 1.0,
    "seed": 0,
    "deterministic": True,
    "max_steps_per_epoch": 8,
    "eval_max_batches": 2,
    "checkpoint_every_steps": 3,
    "log_every_steps": 1,
    "measure_warmup_steps": 2,
    "measure_intervals": 2,
    "keep_checkpoints": True,
    "pg_timeout_s": 60,
}


def resnet_run(**changes: Any) -> dict[str, Any]:
    return {**RESNET, **changes}


def lm_run(**changes: Any) -> dict[str, Any]:
    return {**LM, **changes}
