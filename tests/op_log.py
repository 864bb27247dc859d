"""The aten operators torch runs while a block runs (tests/test_loader.py, tests/test_gpu_path.py count the
host synchronisations among them)."""

from __future__ import annotations

from torch.utils._python_dispatch import TorchDispatchMode


class OpLog(TorchDispatchMode):
    """The aten operators run while active (what a GPU would be asked to do): `ops`, by name."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func._schema.name)
        return func(*args, **(kwargs or {}))
