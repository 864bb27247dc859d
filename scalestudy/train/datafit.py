"""Whether the training data holds one full batch on every rank, checked from the data's files
before any process group starts (issue 23, item 7): a per_gpu_batch larger than the data set is a
bad input, named with the key and the sizes (exit 2), not a traceback from the loader after the
ranks have met. The counts are the loaders' own: each workload's spec names its `batch_fit`
function (scalestudy.workloads.resnet_cifar.workload.batch_capacity: a rank's shard of the
training images; scalestudy.workloads.gpt.workload.batch_capacity: windows of seq_len + 1 tokens of
one global batch); reading them maps the arrays and checks them as the loaders will (the LM's
tokens are hashed once per process: loader._verify remembers them)."""

from __future__ import annotations

from typing import Any

from scalestudy.plan import workloads
from scalestudy.plan.runconfig import RunConfigError
from scalestudy.plan.workload_spec import resolve


def check_batch_fits(config: dict[str, Any]) -> None:
    """RunConfigError naming per_gpu_batch, the data and both sizes when a rank gets no full batch.
    A damaged data folder raises the loaders' PackedDataError (a ValueError: exit 2 too)."""
    batch_fit = workloads.get(config["workload"]).batch_fit
    if batch_fit is None:
        return
    have, unit, need, per = resolve(batch_fit)(config)
    if have < need:
        raise RunConfigError(
            f"per_gpu_batch={config['per_gpu_batch']} does not fit the data: data_dir {config['data_dir']}"
            f" gives {have} {unit}, fewer than {per}: lower per_gpu_batch"
        )
