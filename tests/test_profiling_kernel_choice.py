"""Which kernels ncu profiles (scalestudy.profiling.kernel_choice): the config's regex, else the top
kernels of the one-GPU profile run (nsys where it ran, else the torch profiler's, the loader's left
out), else every kernel; and the trainer's kernel table they come from (scalestudy.train.ranges)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from scalestudy.plan import runfiles
from scalestudy.profiling import kernel_choice
from scalestudy.profiling.kernel_choice import (
    ALL_KERNELS,
    CONVOLUTION_FAMILIES,
    kernel_selection,
    names_regex,
)
from scalestudy.train.ranges import kernels_table

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "profiling"
KERN_SUM = FIXTURES / "nsys_w2" / "r0_cuda_gpu_kern_sum.csv"
TORCH_KERNELS = FIXTURES / "torch_w1_cuda" / runfiles.PROFILE_KERNELS
FPROP = (
    "sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64_"
    "warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cudnn"
)
DGRAD = FPROP.replace("fprop", "dgrad")
WGRAD = FPROP.replace("fprop", "wgrad")
LOADER_ONLY = {"indexSelectLargeIndex", "elementwise_kernel_with_index"}


@pytest.mark.parametrize(
    ("kernel", "function"),
    [
        ("sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64", None),
        ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTN", None),
        (
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm *, unsigned long, ncclWork *)",
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
        ),
        (
            "void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, (int)512, (bool)1, (int)1>"
            "(cudnnTensorStruct, const T1 *)",
            "bn_fw_tr_1C11_kernel_NCHW",
        ),
        (
            "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
            "std::array<char *, 1>>(int, T2, T3)",
            "vectorized_elementwise_kernel",
        ),
        (
            "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::"
            "AddFunctor<float>>(at::TensorIteratorBase &, const T1 &)::[lambda(int) (instance 1)]>(int, T3)",
            "elementwise_kernel",
        ),
        (
            "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<T>(T1, T2)",
            "multi_tensor_apply_kernel",
        ),
        ("void unbalanced<int>)", "unbalanced<int>)"),  # left as it is, less its return type
    ],
)
def test_kernel_function_names_as_ncus_function_name_base(kernel, function):
    assert kernel_choice.function_name(kernel) == (function or kernel)


def test_the_top_kernels_come_from_the_nsys_summary_by_total_time():
    names = kernel_choice.top_kernel_names(KERN_SUM.read_text(), 3)
    assert names == [
        "sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16_stage4_warpsize2x2x1_g1_tensor16x8x8_kernel",
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
        "sm80_xmma_dgrad_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize64x64x16_stage4_warpsize2x2x1_g1_tensor16x8x8_kernel",
    ]
    merged = "Total Time (ns),Instances,Name\n5,1,void f<1>(int)\n4,1,void f<2>(int)\n8,1,g\n"
    assert kernel_choice.top_kernel_names(merged, 5) == ["f", "g"]  # instantiations add up: 9 > 8
    with pytest.raises(kernel_choice.KernelTableError, match="k.csv: no .*Total Time"):
        kernel_choice.top_kernel_names("Time,Kernel\n1,x\n", 3, "k.csv")


# --- the torch profile's kernel table ---------------------------------------------------------------


def test_the_top_kernels_of_the_torch_profile_leave_the_loaders_out():
    """By device time, not counting the loader's `data` range: the fill kernel the loader shares
    with the model's ReLU (vectorized_elementwise_kernel) counts only its 5,000 us in `forward`, and
    the gather of the augmentation (18,000 us) takes no place; Memset, Memcpy and the `forward`
    range's own GPU annotation are no kernels, however long."""
    names = kernel_choice.top_torch_kernel_names(TORCH_KERNELS.read_text(), 5)
    assert names == [
        FPROP,
        DGRAD,
        WGRAD,
        "batch_norm_collect_statistics_channels_last_kernel",
        "vectorized_elementwise_kernel",
    ]
    every = kernel_choice.top_torch_kernel_names(TORCH_KERNELS.read_text(), 10)
    assert every[5:] == ["multi_tensor_apply_kernel"] and not LOADER_ONLY & set(every)


def test_the_loaders_kernels_come_in_when_the_config_asks_for_them():
    names = kernel_choice.top_torch_kernel_names(TORCH_KERNELS.read_text(), 5, loader_kernels=True)
    # the loader's gather, and the elementwise kernel with its fill share: 5,000 + 6,000 us
    assert names == [FPROP, DGRAD, WGRAD, "indexSelectLargeIndex", "vectorized_elementwise_kernel"]
    every = kernel_choice.top_torch_kernel_names(TORCH_KERNELS.read_text(), 20, loader_kernels=True)
    assert set(every) >= LOADER_ONLY and not {"forward", "Memset", "Memcpy"} & set(every)


def test_a_torch_kernel_table_without_its_columns_is_named():
    with pytest.raises(kernel_choice.KernelTableError, match="k.csv: no .*device_us"):
        kernel_choice.top_torch_kernel_names("name,count\nx,1\n", 3, source="k.csv")


def record(folder: Path, tool: str, run_dir: Path | None = None) -> Path:
    path = folder / "profile_tool.json"
    path.write_text(json.dumps({"tool": tool, "run_dir": str(run_dir or folder), "world_size": 1}))
    return path


def torch_run(tmp_path: Path) -> Path:
    run_dir = tmp_path / "runs" / "profile" / "w1"
    run_dir.mkdir(parents=True)
    (run_dir / runfiles.PROFILE_KERNELS).write_text(TORCH_KERNELS.read_text())
    return record(run_dir, "torch")


def test_the_regex_is_built_from_the_torch_profiles_top_kernels(tmp_path):
    regex, source = kernel_selection(None, torch_run(tmp_path), tmp_path / "nsys_stats", 10)
    assert regex.startswith("regex:") and "top 6 kernels" in source and "loader's left out" in source
    pattern = re.compile(regex.removeprefix("regex:"))  # ncu's regex: finds the pattern in the name
    for name in (FPROP, DGRAD, WGRAD, "vectorized_elementwise_kernel", "multi_tensor_apply_kernel"):
        assert pattern.search(name) and pattern.search(f"at::native::{name}"), name
    for name in (*LOADER_ONLY, "Memset (Device)", "forward", "vectorized_elementwise"):
        assert not pattern.search(name), name
    with_loader, _ = kernel_selection(None, torch_run(tmp_path / "b"), None, 10, loader_kernels=True)
    assert re.compile(with_loader.removeprefix("regex:")).search("indexSelectLargeIndex")


def test_nsys_is_preferred_where_it_ran(tmp_path):
    """The record says which tool profiled the point: nsys's summary then, not a kernel table of
    the trainer's that happens to lie in the run folder."""
    run_dir = torch_run(tmp_path).parent
    stats = tmp_path / "nsys_stats"
    stats.mkdir()
    (stats / "r0_cuda_gpu_kern_sum.csv").write_text(
        "Total Time (ns),Instances,Name\n9,1,nvjet_tst_x\n8,1,void a::k2<T>(int)\n"
    )
    regex, source = kernel_selection(None, record(run_dir, "nsys"), stats, 3)
    assert regex == f"regex:({'|'.join(CONVOLUTION_FAMILIES)}|nvjet_tst_x|k2)"
    assert "top 2 kernels" in source and str(stats) in source
    assert kernel_selection(None, record(run_dir, "torch"), stats, 3)[0] != regex


def test_the_configured_regex_still_wins(tmp_path):
    for tool in ("torch", "nsys"):
        chosen = kernel_selection("regex:gemm.{0,4}", record(tmp_path, tool), tmp_path, 3)
        assert chosen == ("regex:gemm.{0,4}", "profiling.ncu.kernel_regex")


def test_every_kernel_where_the_profile_says_nothing(tmp_path):
    assert kernel_selection(None, None, None, 3)[0] == ALL_KERNELS  # no one-GPU profile run
    empty = tmp_path / "empty"
    empty.mkdir()
    regex, source = kernel_selection(None, record(empty, "torch"), None, 3)
    assert regex == ALL_KERNELS and "no kernel summary" in source and runfiles.PROFILE_KERNELS in source
    (empty / runfiles.PROFILE_KERNELS).write_text(",".join(runfiles.PROFILE_KERNEL_COLUMNS) + "\n")
    regex, source = kernel_selection(None, record(empty, "torch"), None, 3)  # a CPU run: no kernels
    assert regex == ALL_KERNELS and "lists no kernel" in source
    assert kernel_selection(None, record(empty, "nsys"), empty, 3)[0] == ALL_KERNELS  # nothing exported


def test_the_rules_options_name_the_profile_they_read():
    settings = {"top_kernels": 5, "launch_count": 7, "kernel_regex": None, "loader_kernels": False}
    record_path, stats = "results/runs/profile/w1/profile_tool.json", "results/profile/w1/nsys_stats"
    args = kernel_choice.selection_args(settings, [record_path], [stats])
    assert args == ["--top-kernels", "5", "--launch-count", "7"] + [
        "--profile-record",
        record_path,
        "--nsys-stats",
        stats,
    ]
    args = kernel_choice.selection_args(
        {**settings, "kernel_regex": "regex:x", "loader_kernels": True}, [], []
    )
    assert args == [
        "--top-kernels",
        "5",
        "--launch-count",
        "7",
        "--kernel-regex",
        "regex:x",
        "--loader-kernels",
    ]


# --- the trainer's kernel table ---------------------------------------------------------------------


def event(name: str, parent=None, kernels=()):
    """A torch FunctionEvent as kernels_table reads it: name, CPU parent, kernels (name, duration us)."""
    found = [SimpleNamespace(name=k, device=0, duration=us) for k, us in kernels]
    return SimpleNamespace(name=name, cpu_parent=parent, kernels=found)


def test_each_kernel_is_attributed_to_the_named_range_its_op_ran_in():
    step = event("step")
    data, forward = event("data", step), event("forward", step, [("forward", 900.0)])
    events = [
        step,
        data,
        forward,
        event("aten::index_select", data, [("gather", 10.0), ("gather", 12.0)]),
        event("aten::add_", event("aten::mul", data), [("add<long>", 1.0)]),  # nested below data
        event("aten::cudnn_convolution", event("aten::conv2d", forward), [("fprop", 300.0)]),
        event("autograd::engine::evaluate_function: ConvolutionBackward0", None, [("dgrad", 250.0)]),
        event("aten::relu_", None, []),
    ]
    table = kernels_table(events)
    assert list(table.columns) == list(runfiles.PROFILE_KERNEL_COLUMNS)
    rows = {(row.name, row.range): (row.count, row.device_us) for row in table.itertuples(index=False)}
    assert rows == {
        ("forward", "forward"): (1, 900.0),
        ("fprop", "forward"): (1, 300.0),
        ("dgrad", ""): (1, 250.0),  # autograd's own thread: outside every range
        ("gather", "data"): (2, 22.0),
        ("add<long>", "data"): (1, 1.0),
    }
    assert list(table["device_us"]) == sorted(table["device_us"], reverse=True)


def test_a_cpu_profile_writes_a_kernel_table_with_no_rows(tmp_path):
    import torch

    from scalestudy.train.ranges import ProfileWindow, named_range

    window = ProfileWindow({"tool": "torch", "start_step": 0, "steps": 2}, tmp_path)
    for step in range(3):
        window.step(step)
        with named_range("step"), named_range("data"):
            torch.ones(8).sum()
    window.close()
    lines = (tmp_path / runfiles.PROFILE_KERNELS).read_text().splitlines()
    assert lines == [",".join(runfiles.PROFILE_KERNEL_COLUMNS)]


def test_the_regex_reaches_convolutions_however_ncu_names_them():
    """The H200's profile listed cuDNN's convolutions by their bare names; ncu, given exactly those
    names anchored, profiled 40 element-wise and batch-norm launches and no convolution. The regex
    now matches a name anywhere in ncu's, and every convolution family whatever the top list says."""
    top = ["vectorized_elementwise_kernel", "batch_norm_collect_statistics_channels_last_kernel"]
    pattern = re.compile(names_regex(top).removeprefix("regex:"))
    for ncu_name in (
        "sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64_kernel__5x_cudnn",
        "cudnn::engines_precompiled::sm90_xmma_dgrad_implicit_gemm_kernel(Params)",
        "at::native::vectorized_elementwise_kernel",
        "batch_norm_collect_statistics_channels_last_kernel",
    ):
        assert pattern.search(ncu_name), ncu_name
    for other in ("fill_kernel", "reduce_kernel", "index_elementwise_kernel_with_index"):
        assert not pattern.search(other), other
    assert not re.compile(names_regex([]).removeprefix("regex:")).search("fill_kernel")
