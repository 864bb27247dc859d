"""The machine's achievable matmul rate, measured in the run: the denominator of MFU."""

from __future__ import annotations

from scalestudy.benchmark.measure import timed_rate


def matmul_flops(size: int) -> int:
    """FLOPs of one square matmul (size x size) @ (size x size): a multiply-add counts 2."""
    return 2 * size**3


def matmul_rate(device, dtype, size: int, iterations: int) -> float:
    """FLOP/s of `iterations` back-to-back square matmuls of `size` in `dtype` on `device` (one sample)."""
    import torch

    generator = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=generator).to(device=device, dtype=dtype)
    b = torch.randn(size, size, generator=generator).to(device=device, dtype=dtype)
    out = torch.empty(size, size, device=device, dtype=dtype)

    def work() -> float:
        for _ in range(iterations):
            torch.matmul(a, b, out=out)
        return float(matmul_flops(size) * iterations)

    return timed_rate(work, device)
