"""Kernel, memory-operation and op names -> breakdown categories."""

from __future__ import annotations

import pytest

from scalestudy.profiling.categorize import category


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        # nsys / ncu kernel names
        (
            "sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16",
            "conv_gemm",
        ),
        ("sm90_xmma_dgrad_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64", "conv_gemm"),
        ("void cudnn::winograd_nonfused::winogradForwardData4x4<float, float>(...)", "conv_gemm"),
        ("ampere_scudnn_128x64_relu_interior_nn_v1", "conv_gemm"),  # "relu" in a cuDNN conv name
        ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_16x6_tn_align4>(T1::Params)", "conv_gemm"),
        ("volta_sgemm_128x64_nt", "conv_gemm"),
        (
            "void nchwToNhwcKernel<float, float, float, true, false, (cudnnKernelDataType_t)2>(...)",
            "conv_gemm",
        ),
        ("void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 512, true, 1>(...)", "norm_elementwise"),
        ("void cudnn::bn_bw_1C11_kernel_new<float, float, float2, 512, true, 1>(...)", "norm_elementwise"),
        ("void at::native::batch_norm_collect_statistics_channels_last_kernel<...>", "norm_elementwise"),
        (
            "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, ...>",
            "norm_elementwise",
        ),
        ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, ...>>", "norm_elementwise"),
        ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<...>", "norm_elementwise"),
        (
            "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float>(...)",
            "norm_elementwise",
        ),
        (
            "void at::native::(anonymous namespace)::CatArrayBatchedCopy<float, unsigned int, 4, 64, 64>",
            "norm_elementwise",
        ),
        (
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm *, unsigned long, ncclWork *)",
            "communication",
        ),
        ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", "communication"),
        # cuBLASLt's Hopper GEMMs (the Linear layer's matmuls on an H100)
        ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTN", "conv_gemm"),
        ("nvjet_hsh_64x8_64x16_2x1_v_bz_splitK_TNT", "conv_gemm"),
        ("[CUDA memcpy Host-to-Device]", "memory_copy"),
        ("[CUDA memcpy HtoD]", "memory_copy"),
        ("[CUDA memset]", "memory_copy"),
        ("void my_custom_kernel(float *, int)", "other"),
        # torch.profiler op names
        ("aten::convolution", "conv_gemm"),
        ("aten::mkldnn_convolution", "conv_gemm"),
        ("aten::convolution_backward", "conv_gemm"),
        ("aten::addmm", "conv_gemm"),
        ("aten::mm", "conv_gemm"),
        ("aten::native_batch_norm", "norm_elementwise"),
        ("aten::cudnn_batch_norm", "norm_elementwise"),
        ("aten::relu_", "norm_elementwise"),
        ("aten::add_", "norm_elementwise"),
        ("aten::max_pool2d_with_indices", "norm_elementwise"),
        ("aten::_foreach_add_", "norm_elementwise"),
        ("aten::cross_entropy_loss", "norm_elementwise"),
        ("aten::copy_", "memory_copy"),
        ("aten::to", "memory_copy"),
        ("aten::_to_copy", "memory_copy"),
        ("Memcpy HtoD (Pageable -> Device)", "memory_copy"),
        ("gloo:all_reduce", "communication"),
        ("c10d::allreduce_", "communication"),
        ("nccl:all_reduce", "communication"),
        ("record_param_comms", "communication"),
        ("aten::empty", "other"),
        ("aten::view", "other"),
        ("aten::t", "other"),
        ("cudaLaunchKernel", "other"),
        ("Optimizer.step#SGD.step", "other"),
        ("DistributedDataParallel.forward", "other"),
        ("ProfilerStep#3", "other"),
    ],
)
def test_category(name, expected):
    assert category(name) == expected


def test_aten_prefix_rules_are_anchored():
    # "to" and "mm" are whole op names, not prefixes: aten::topk is a computing op like any other
    assert category("aten::to") == "memory_copy" and category("aten::topk") == "norm_elementwise"
