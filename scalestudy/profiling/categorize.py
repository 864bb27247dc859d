"""Map a CUDA kernel, a GPU memory operation or a torch op name to a breakdown category.

One function serves nsys kernel names (`sm80_xmma_fprop_implicit_gemm...`, `ncclDevKernel_...`),
nsys memory operations (`[CUDA memcpy Host-to-Device]`), ncu kernel names and torch.profiler op
names (`aten::convolution`, `gloo:all_reduce`). Rules are tried in order; the first match wins:

1. communication: NCCL / gloo / c10d collectives;
2. memory copy: memcpy / memset operations and the copying torch ops (`aten::copy_`, `aten::to`);
3. normalisation kernels whose names also mention cudnn (`cudnn::bn_fw_tr_...`);
4. convolution/GEMM: cuDNN / cuBLAS / CUTLASS kernels (cuBLASLt's Hopper GEMMs are `nvjet_*`),
   `aten::convolution`, mkldnn, `addmm`, `mm`;
5. normalisation+elementwise: norm, elementwise, reduction, pooling, loss and optimizer kernels;
6. any other `aten::` op that computes (not a view, allocation or metadata op) counts as
   normalisation+elementwise; everything else (runtime API rows, Python wrappers, unknown
   kernels) is `other` and ends up in the idle/other category.
"""

from __future__ import annotations

import re

from scalestudy.profiling.schema import COMM, CONV_GEMM, MEMCPY, NORM_ELEMENTWISE, OTHER

_RULES: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (category, re.compile(pattern, re.IGNORECASE))
    for category, pattern in (
        (COMM, r"nccl|gloo|c10d::|record_param_comms|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all"),
        (
            MEMCPY,
            r"memcpy|memset|^aten::(copy_|to|_to_copy|_copy_from\w*|clone|contiguous)$|^(memcpy|memset) ",
        ),
        (NORM_ELEMENTWISE, r"batch_?norm|\bbn_(fw|bw)|bn_fw_|bn_bw_"),
        (
            CONV_GEMM,
            r"conv|cudnn|gemm|xmma|cutlass|nvjet|wgrad|dgrad|fprop|winograd|mkldnn|onednn|cublas|"
            r"nchwtonhwc|nhwctonchw|^aten::(addmm|mm|bmm|matmul|linear|baddbmm)$",
        ),
        (
            NORM_ELEMENTWISE,
            r"norm|elementwise|reduce_kernel|reduction|multi_tensor|foreach|pool|softmax|nll_loss|"
            r"cross_entropy|relu|threshold|catarraybatchedcopy|fill_kernel|index_kernel|sgd_kernel|fused_sgd",
        ),
    )
)

# aten ops that only create views, allocate or read metadata: no compute of their own.
_BOOKKEEPING = re.compile(
    r"^aten::(empty\w*|view\w*|as_strided\w*|reshape|_reshape_alias|_unsafe_view|t|transpose|permute|"
    r"expand\w*|squeeze\w*|unsqueeze\w*|slice|select|narrow|split\w*|chunk|unbind|flatten|detach\w*|"
    r"alias|lift_fresh|resolve_conj|resolve_neg|result_type|item|_local_scalar_dense|is_nonzero|"
    r"set_|resize_\w*|numpy_t|size|stride|dim|broadcast_tensors|unflatten|_has_compatible_shallow_copy_type)$"
)


def category(name: str) -> str:
    """The category key of one kernel, memory operation or torch op (see the module doc)."""
    text = str(name).strip()
    for key, pattern in _RULES:
        if pattern.search(text):
            return key
    if text.startswith("aten::") and not _BOOKKEEPING.match(text):
        return NORM_ELEMENTWISE
    return OTHER
