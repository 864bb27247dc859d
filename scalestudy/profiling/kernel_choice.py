"""Which kernels Nsight Compute profiles: the config's regex, else the top kernels by GPU time of the
profile run of the same one-GPU point, else every kernel.

In that order (`kernel_selection`):

1. `profiling.ncu.kernel_regex`, when the config sets one: it always wins;
2. the `profiling.ncu.top_kernels` kernels with the most GPU time in the profile run of the
   one-GPU point (`results/runs/profile/w1/`, its record `profile_tool.json` says which tool ran):
   - nsys, where it ran: rank 0's `cuda_gpu_kern_sum` (`<nsys_stats>/r0_cuda_gpu_kern_sum.csv`);
   - torch.profiler otherwise (no nsys on the node, as on the GPU machines this project was tried
     on): the trainer's `profile_kernels.csv` (scalestudy.train.ranges.kernels_table), each kernel
     with the named range its op was launched in. The loader's kernels (range `data`) are left out
     unless `profiling.ncu.loader_kernels` asks for them; so are memory operations and the
     profiler's range markers, which are no kernels;
   kernels are matched by function name (`--kernel-name-base function`: `function_name`), the
   instantiations of one function adding up;
3. every kernel, where there is no such profile (`profiling.world_sizes` without 1) or it holds no
   kernel (a CPU run).

Whatever the names, ncu only profiles launches inside the trainer's NVTX `step` ranges and, unless
`loader_kernels`, outside its `data` ranges (scalestudy.profiling.ncu.profile_prefix): an
elementwise kernel the loader and the model share is profiled only where the model launches it.
An nsys summary does not say which range launched a kernel, so from nsys a loader kernel may take
one of the `top_kernels` places (its launches are still left out by the NVTX filter).

Stdlib only: rule profile_ncu's params call `selection_args` when the Snakefile is parsed.
"""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

from scalestudy.plan import runfiles
from scalestudy.profiling import nsys
from scalestudy.profiling.schema import DATA_RANGE, NAMED_RANGES

ALL_KERNELS = "regex:.*"
# Device activities torch lists beside the kernels that ncu cannot profile.
NOT_KERNELS = re.compile(r"^(Memcpy|Memset)\b|^ProfilerStep#")


class KernelTableError(ValueError):
    """A kernel summary that does not have the expected shape (names the file and the columns)."""


def function_name(kernel: str) -> str:
    """A kernel's function name as ncu's --kernel-name-base function sees it: no return type,
    namespace, template arguments or parameters ('void at::native::f<4, T>(int, T)' -> 'f')."""
    text = _without_trailing_group(kernel.strip(), "(", ")")
    text = _without_trailing_group(text, "<", ">")
    text = text.rsplit("::", 1)[-1]
    words = text.split()
    return words[-1] if words else text


def _without_trailing_group(text: str, opening: str, closing: str) -> str:
    """`text` without a balanced (...) or <...> group at its end."""
    if not text.endswith(closing):
        return text
    depth = 0
    for index in range(len(text) - 1, -1, -1):
        depth += {closing: 1, opening: -1}.get(text[index], 0)
        if depth == 0:
            return text[:index].rstrip()
    return text  # unbalanced: leave it as it is


def _heaviest(totals: dict[str, float], top: int) -> list[str]:
    return sorted(totals, key=lambda name: -totals[name])[:top]  # ties: in the order first seen


def _rows(text: str, required: set[str], source: str, what: str) -> list[dict]:
    rows = list(csv.DictReader(io.StringIO(text)))
    if rows and not required <= set(rows[0]):
        raise KernelTableError(f"{source}: no {sorted(required)} columns (not {what}?)")
    return rows


def top_kernel_names(kern_sum_csv: str, top: int, source: str = "<nsys cuda_gpu_kern_sum>") -> list[str]:
    """The function names of the `top` kernels with the most total GPU time (nsys cuda_gpu_kern_sum)."""
    totals: dict[str, float] = {}
    for row in _rows(kern_sum_csv, {"Total Time (ns)", "Name"}, source, "nsys cuda_gpu_kern_sum"):
        name = function_name(row["Name"])
        totals[name] = totals.get(name, 0.0) + float(row["Total Time (ns)"].replace(",", "") or 0)
    return _heaviest(totals, top)


def is_kernel(name: str) -> bool:
    """Whether a device activity of the torch profile is a kernel ncu can profile."""
    return bool(name) and name not in NAMED_RANGES and not NOT_KERNELS.search(name)


def top_torch_kernel_names(
    kernels_csv: str, top: int, loader_kernels: bool = False, source: str = f"<{runfiles.PROFILE_KERNELS}>"
) -> list[str]:
    """The function names of the `top` kernels with the most device time in the trainer's
    profile_kernels.csv; those launched in the loader's `data` range only with `loader_kernels`."""
    totals: dict[str, float] = {}
    columns = set(runfiles.PROFILE_KERNEL_COLUMNS)
    for row in _rows(kernels_csv, columns, source, "the trainer's profile_kernels.csv"):
        if not is_kernel(row["name"]) or (row["range"] == DATA_RANGE and not loader_kernels):
            continue
        name = function_name(row["name"])
        totals[name] = totals.get(name, 0.0) + float(row["device_us"] or 0)
    return _heaviest(totals, top)


# Convolution kernel families, whatever the exact name: on an H200 (2026-11-28) the top kernels'
# exact names (anchored, as torch.profiler lists cuDNN's `sm90_xmma_fprop_implicit_gemm_..._cudnn`)
# matched ncu's element-wise and batch-norm kernels but no convolution in 40 launches.
CONVOLUTION_FAMILIES = ("xmma", "implicit_gemm", "fprop", "dgrad", "wgrad", "winograd", "conv", "cudnn")


def names_regex(names: list[str]) -> str:
    """An ncu --kernel-name value matching every kernel whose function name contains one of these
    names (the namespaces ncu keeps, or a suffix, do not matter) or a convolution family's mark:
    the study's convolutions are profiled however cuDNN's kernels are named there."""
    words = [*CONVOLUTION_FAMILIES, *(re.escape(name) for name in names if name not in CONVOLUTION_FAMILIES)]
    return "regex:(" + "|".join(words) + ")"


def selection_args(settings: dict, profile_record: str | list, nsys_stats: str | list) -> list[str]:
    """`ncu run`'s kernel-choice options from the config's profiling.ncu (rule profile_ncu's params);
    `profile_record` and `nsys_stats` are the one-GPU profile's files, or empty lists."""
    args = ["--top-kernels", settings["top_kernels"], "--launch-count", settings["launch_count"]]
    if settings["kernel_regex"]:
        args += ["--kernel-regex", settings["kernel_regex"]]
    for option, paths in (("--profile-record", profile_record), ("--nsys-stats", nsys_stats)):
        paths = [paths] if isinstance(paths, str) else list(paths)  # one path, or none
        if paths:
            args += [option, paths[0]]
    if settings.get("loader_kernels"):
        args.append("--loader-kernels")
    return [str(arg) for arg in args]


def kernel_selection(
    kernel_regex: str | None,
    profile_record: Path | None,
    nsys_stats: Path | None,
    top: int,
    loader_kernels: bool = False,
) -> tuple[str, str]:
    """(the --kernel-name value, where it came from): the config's regex, the top kernels of the
    one-GPU profile run (nsys where it ran, else torch.profiler's), or every kernel (module doc)."""
    if kernel_regex:
        return kernel_regex, "profiling.ncu.kernel_regex"
    if profile_record is None:
        return ALL_KERNELS, "every kernel (no kernel_regex and no profile run of the one-GPU point)"
    record = json.loads(Path(profile_record).read_text())
    tool = record.get("tool")
    if tool not in ("nsys", "torch"):
        return ALL_KERNELS, f"every kernel (the profile run of {profile_record} used {tool!r})"
    table = profile_kernel_table(record, nsys_stats)
    if table is None or not table.is_file():
        return ALL_KERNELS, f"every kernel (no kernel summary {table} of the {tool} profile run)"
    if tool == "nsys":
        names = top_kernel_names(table.read_text(), top, str(table))
    else:
        names = top_torch_kernel_names(table.read_text(), top, loader_kernels, str(table))
    if not names:
        return ALL_KERNELS, f"every kernel ({table} lists no kernel)"
    loader = "" if tool == "nsys" or loader_kernels else ", the loader's left out"
    return names_regex(names), f"the top {len(names)} kernels by GPU time in {table}{loader}"


def profile_kernel_table(record: dict, nsys_stats: Path | None) -> Path | None:
    """The kernel summary of a profile run: nsys's of rank 0, or the trainer's profile_kernels.csv."""
    if record["tool"] == "nsys":
        return nsys.stats_csv(nsys_stats, 0, nsys.KERNELS) if nsys_stats else None
    return Path(record["run_dir"]) / runfiles.PROFILE_KERNELS
