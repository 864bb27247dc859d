"""Whether the training data holds one full batch on every rank, checked from the data's files
before any process group starts (issue 23, item 7): a per_gpu_batch larger than the data set is a
bad input, named with the key and the sizes (exit 2), not a traceback from the loader after the
ranks have met. The counts are the loaders' own (scalestudy.workloads.resnet_cifar.loader: a rank's
shard of the training images; scalestudy.workloads.gpt.loader: windows of seq_len + 1 tokens of one
global batch); reading them maps the arrays and checks them as the loaders will (the LM's tokens
are hashed once per process: loader._verify remembers them)."""

from __future__ import annotations

from typing import Any

from scalestudy.plan.runconfig import RunConfigError


def check_batch_fits(config: dict[str, Any]) -> None:
    """RunConfigError naming per_gpu_batch, the data and both sizes when a rank gets no full batch.
    A damaged data folder raises the loaders' PackedDataError (a ValueError: exit 2 too)."""
    batch, ranks, data_dir = config["per_gpu_batch"], config["world_size"], config["data_dir"]
    if config["workload"] == "gpt":
        from scalestudy.workloads.gpt.loader import load_tokens
        from scalestudy.workloads.gpt.workload import model_config

        window = model_config(config).seq_len + 1
        tokens = len(load_tokens(data_dir, "train"))
        have, unit = tokens // window, f"windows of seq_len + 1 = {window} tokens ({tokens} tokens)"
        need, per = batch * ranks, f"one global batch of per_gpu_batch={batch} x {ranks} ranks"
    elif config["workload"] == "resnet18-cifar10":
        from scalestudy.data.preprocess import load_packed

        images = len(load_packed(data_dir, "train")[0])
        have, unit = images // ranks, f"training images per rank ({images} over {ranks} ranks)"
        need, per = batch, f"one batch of per_gpu_batch={batch}"
    else:
        return
    if have < need:
        raise RunConfigError(
            f"per_gpu_batch={batch} does not fit the data: data_dir {data_dir} gives {have} {unit}, "
            f"fewer than {per}: lower per_gpu_batch"
        )
