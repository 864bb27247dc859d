"""The system description: parsers with known answers (nvidia-smi topo -m in its documented layout in
preflight.nvidia; /proc, /sys in preflight.machine), NVML through a fake, the per-node srun command,
and the command line on this machine."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from scalestudy.preflight import common, machine, nvidia
from scalestudy.preflight import system as sysinfo

# `nvidia-smi topo -m` on a 4-GPU node with two NICs, in the layout the driver prints (tab-separated,
# the header underlined with ANSI codes by newer drivers, then the legend and the NIC legend).
TOPO = (
    "\t\x1b[4mGPU0\tGPU1\tGPU2\tGPU3\tNIC0\tNIC1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
    "GPU0\t X \tNV18\tNV18\tNV18\tPXB\tSYS\t0-31,64-95\t0\t\tN/A\n"
    "GPU1\tNV18\t X \tNV18\tNV18\tPXB\tSYS\t0-31,64-95\t0\t\tN/A\n"
    "GPU2\tNV18\tNV18\t X \tNV18\tSYS\tPXB\t32-63,96-127\t1\t\tN/A\n"
    "GPU3\tNV18\tNV18\tNV18\t X \tSYS\tPXB\t32-63,96-127\t1\t\tN/A\n"
    "NIC0\tPXB\tPXB\tSYS\tSYS\t X \tSYS\n"
    "NIC1\tSYS\tSYS\tPXB\tPXB\tSYS\t X \n"
    "\n"
    "Legend:\n"
    "\n"
    "  X    = Self\n"
    "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)\n"
    "  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a"
    " NUMA node\n"
    "  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)\n"
    "  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)\n"
    "  PIX  = Connection traversing at most a single PCIe bridge\n"
    "  NV#  = Connection traversing a bonded set of # NVLinks\n"
    "\n"
    "NIC Legend:\n"
    "\n"
    "  NIC0: mlx5_0\n"
    "  NIC1: mlx5_1\n"
)


def test_topology_parser_known_answer():
    topo = nvidia.parse_topology(TOPO)
    assert topo["devices"] == ["GPU0", "GPU1", "GPU2", "GPU3", "NIC0", "NIC1"]
    assert topo["links"]["GPU0"] == {
        "GPU1": "NV18",
        "GPU2": "NV18",
        "GPU3": "NV18",
        "NIC0": "PXB",
        "NIC1": "SYS",
    }
    assert topo["links"]["GPU2"]["NIC1"] == "PXB" and topo["links"]["NIC1"]["GPU0"] == "SYS"
    assert topo["affinity"]["GPU2"] == {
        "CPU Affinity": "32-63,96-127",
        "NUMA Affinity": "1",
        "GPU NUMA ID": "N/A",
    }
    assert topo["nics"] == {"NIC0": "mlx5_0", "NIC1": "mlx5_1"}
    assert topo["legend"]["NV#"] == "Connection traversing a bonded set of # NVLinks"
    assert nvidia.topology_summary(topo) == "GPU-GPU NV18; GPU-NIC PXB, SYS"


def test_topology_parser_takes_space_separated_text_and_refuses_garbage():
    spaced = (
        "        GPU0    GPU1    CPU Affinity    NUMA Affinity\n"
        "GPU0     X      PIX     0-7     0\n"
        "GPU1    PIX      X      0-7     0\n"
    )
    topo = nvidia.parse_topology(spaced)
    assert topo["links"] == {"GPU0": {"GPU1": "PIX"}, "GPU1": {"GPU0": "PIX"}}
    assert topo["affinity"]["GPU1"] == {"CPU Affinity": "0-7", "NUMA Affinity": "0"}
    with pytest.raises(ValueError, match="no header line"):
        nvidia.parse_topology("No devices were found\n")


CPUINFO = "\n\n".join(
    f"processor\t: {i}\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n"
    f"physical id\t: {i // 4}\ncore id\t\t: {(i // 2) % 2}\n"
    for i in range(8)
)  # 2 sockets x 2 cores x 2 hardware threads


def test_proc_parsers_known_answers():
    assert machine.parse_cpuinfo(CPUINFO) == {
        "model": "Intel(R) Xeon(R) Platinum 8480+",
        "sockets": 2,
        "cores": 4,
        "logical": 8,
    }
    assert machine.parse_meminfo("MemTotal:       263846928 kB\nMemFree: 1 kB\n") == 263846928 * 1024
    assert machine.parse_os_release('NAME="Rocky"\nPRETTY_NAME="Rocky Linux 9.3 (Blue Onyx)"\n') == (
        "Rocky Linux 9.3 (Blue Onyx)"
    )


MOUNTS = """\
/dev/root / ext4 rw 0 0
lustre01@o2ib:/scratch /scratch lustre rw 0 0
tmpfs /scratch/tmp tmpfs rw 0 0
/dev/sdb1 /scratch/tmp xfs rw 0 0
/dev/sdc1 /scratch2 xfs rw 0 0
"""


def test_the_mount_of_a_path_is_its_longest_prefix_and_the_last_mount_wins():
    assert machine.mount_of("/scratch/user/results", MOUNTS)["fs_type"] == "lustre"
    assert machine.mount_of("/scratch/tmp/x", MOUNTS)["fs_type"] == "xfs"  # mounted over the tmpfs
    assert machine.mount_of("/scratch2", MOUNTS)["device"] == "/dev/sdc1"
    assert machine.mount_of("/scratch20/x", MOUNTS)["fs_type"] == "ext4"  # not under /scratch2
    assert machine.mount_of("/home/x", MOUNTS) == {
        "device": "/dev/root",
        "mount_point": "/",
        "fs_type": "ext4",
    }


def fake_sys(root: Path) -> Path:
    def put(path: str, text: str) -> None:
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text + "\n")

    put("sys/class/net/eth0/speed", "25000")
    put("sys/class/net/eth0/operstate", "up")
    put("sys/class/net/eth0/mtu", "9000")
    put("sys/class/net/eth0/type", "1")
    put("sys/class/net/ib0/speed", "-1")  # what a down or unknown link reports
    put("sys/class/net/ib0/type", "32")
    put("sys/class/net/lo/type", "772")
    put("sys/class/infiniband/mlx5_0/ports/1/rate", "400 Gb/sec (4X NDR)")
    put("sys/class/infiniband/mlx5_0/ports/1/state", "4: ACTIVE")
    put("sys/class/infiniband/mlx5_0/ports/1/phys_state", "5: LinkUp")
    put("sys/class/infiniband/mlx5_0/ports/1/link_layer", "InfiniBand")
    put("proc/cpuinfo", CPUINFO)
    put("proc/meminfo", "MemTotal:       1024 kB")
    for node in ("node0", "node1"):
        (root / "sys/devices/system/node" / node).mkdir(parents=True)
    return root


def test_network_and_infiniband_from_sys(tmp_path):
    net = machine.network(fake_sys(tmp_path))
    assert net["interfaces"] == [
        {"name": "eth0", "state": "up", "speed_mb_s": 25000, "mtu": 9000, "type": "ethernet"},
        {"name": "ib0", "state": None, "speed_mb_s": None, "mtu": None, "type": "infiniband"},
    ]
    assert net["infiniband"] == [
        {
            "device": "mlx5_0",
            "port": "1",
            "rate": "400 Gb/sec (4X NDR)",
            "state": "4: ACTIVE",
            "phys_state": "5: LinkUp",
            "link_layer": "InfiniBand",
        }
    ]


def test_cpu_from_proc_and_sys(tmp_path):
    found = machine.cpu(fake_sys(tmp_path))
    assert (found["model"], found["sockets"], found["cores"], found["logical_cpus"]) == (
        "Intel(R) Xeon(R) Platinum 8480+",
        2,
        4,
        8,
    )
    assert found["numa_nodes"] == 2 and found["memory_bytes"] == 1024 * 1024


class FakeNVML:
    """Two H100s as NVML (nvidia-ml-py) describes them."""

    NVML_CLOCK_SM, NVML_CLOCK_MEM = 1, 2

    def __init__(self):
        self.shut = False

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        self.shut = True

    def nvmlSystemGetDriverVersion(self):
        return b"580.65.06"

    def nvmlSystemGetCudaDriverVersion(self):
        return 13000

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetName(self, handle):
        return "NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetUUID(self, handle):
        return f"GPU-000{handle}"

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(total=85520809984)

    def nvmlDeviceGetEnforcedPowerLimit(self, handle):
        return 700000  # mW

    def nvmlDeviceGetMaxClockInfo(self, handle, kind):
        if kind == self.NVML_CLOCK_MEM:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return 1980

    def nvmlDeviceGetPciInfo(self, handle):
        return SimpleNamespace(busId=f"00000000:1{handle}:00.0".encode())


def test_gpus_through_nvml():
    nvml = FakeNVML()
    found = nvidia.gpus(nvml)
    assert (
        nvml.shut and found["available"] and found["driver"] == "580.65.06" and found["cuda_driver"] == "13.0"
    )
    first = found["devices"][0]
    assert first == {
        "index": 0,
        "name": "NVIDIA H100 80GB HBM3",
        "uuid": "GPU-0000",
        "memory_bytes": 85520809984,
        "power_limit_w": 700.0,
        "max_clock_sm_mhz": 1980,
        "max_clock_mem_mhz": None,  # not supported: recorded as unknown, not an error
        "pci_bus_id": "00000000:10:00.0",
    }
    assert found["devices"][1]["uuid"] == "GPU-0001"


def test_no_nvml_says_none():
    class Broken:
        def nvmlInit(self):
            raise OSError("NVML Shared Library Not Found")

    found = nvidia.gpus(Broken())
    assert found == {
        "available": False,
        "reason": "NVML unavailable: NVML Shared Library Not Found",
        "devices": [],
    }


def test_this_machine_as_a_table_row(tmp_path):
    record = sysinfo.describe(str(tmp_path / "results"), str(tmp_path / "data"), "compute")
    row = sysinfo.table_row(record)
    assert list(row) == list(sysinfo.TABLE_COLUMNS)
    assert row["host"] and row["logical_cpus"] >= 1 and row["memory_gb"] > 0
    assert row["results_fs"] != "" and row["results_free_gb"] > 0  # a folder not made yet: its parent
    assert row["torch"]  # the versions come from the torch actually imported
    if not record["gpus"]["available"]:
        assert row["gpus"] == 0 and row["gpu_model"] == "none" and row["gpu_topology"] == "none"


def test_a_gpu_node_as_a_table_row(tmp_path, monkeypatch):
    real_gpus = nvidia.gpus
    monkeypatch.setattr(nvidia, "gpus", lambda: real_gpus(FakeNVML()))
    tools = {"nvidia-smi": TOPO, "sinfo": "slurm 23.11.4\n"}
    monkeypatch.setattr(common, "command_output", lambda argv, timeout=30: tools.get(argv[0]))
    record = sysinfo.describe(str(tmp_path), str(tmp_path), "compute", root=fake_sys(tmp_path / "root"))
    assert record["topology"]["links"]["GPU3"]["NIC1"] == "PXB" and "raw" in record["topology"]
    row = sysinfo.table_row(record)
    assert (row["gpus"], row["gpu_model"], row["gpu_memory_gb"], row["gpu_power_limit_w"]) == (
        2,
        "NVIDIA H100 80GB HBM3",
        85.5,
        700.0,
    )
    assert (row["gpu_driver"], row["cuda_driver"], row["slurm"]) == ("580.65.06", "13.0", "slurm 23.11.4")
    assert row["gpu_topology"] == "GPU-GPU NV18; GPU-NIC PXB, SYS"
    assert row["infiniband"] == "mlx5_0/1 400 Gb/sec (4X NDR) 4: ACTIVE"
    assert row["network"] == "eth0 25 Gb/s; ib0"
    assert (row["sockets"], row["cores"], row["numa_nodes"]) == (2, 4, 2)


def test_per_node_command_under_slurm_and_here():
    spec = {"world_size": 8, "nodes": 2, "tasks_per_node": 4, "cpus_per_task": 8, "gres": "gpu:4"}
    in_batch = {"SLURM_JOB_ID": "42", "SLURM_STEP_ID": "batch"}
    command = sysinfo.per_node_command(spec, ["describe-here", "--kind", "compute"], in_batch)
    assert command[:7] == [
        "srun",
        "--nodes=2",
        "--ntasks=2",
        "--ntasks-per-node=1",
        "--cpus-per-task=8",
        "--kill-on-bad-exit=1",
        "--label",
    ]
    assert "--gres=gpu:4" in command
    assert command[-5:] == ["-m", "scalestudy.preflight.system", "describe-here", "--kind", "compute"]
    imaged = sysinfo.per_node_command(
        {**spec, "image": "img.sif", "apptainer_args": ["--nv"]}, ["x"], in_batch
    )
    at = imaged.index("apptainer")
    assert imaged[at : at + 3] == ["apptainer", "exec", "--nv"] and imaged[at - 1] == "--gres=gpu:4"
    assert imaged[imaged.index("-m") - 1] == "python"  # the image's interpreter
    assert sysinfo.per_node_command(spec, ["x"], {}) is None  # no Slurm: describe this machine


def test_command_line_describes_and_tabulates(tmp_path):
    index = tmp_path / "system/nodes_compute.json"
    args = ["describe", "--out-dir", str(tmp_path / "system"), "--results-dir", str(tmp_path)]
    assert sysinfo.main([*args, "--data-dir", str(tmp_path / "data"), "--index", str(index)]) == 0
    listed = json.loads(index.read_text())
    assert listed["kind"] == "compute" and len(listed["hosts"]) == 1
    host_file = Path(listed["files"][0])
    assert host_file.name == f"{listed['hosts'][0]}.json"
    assert json.loads(host_file.read_text())["provenance"]["timestamp"]
    out = tmp_path / "system.csv"
    assert sysinfo.main(["table", "--index", str(index), "--out", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert [row["host"] for row in rows] == listed["hosts"] and rows[0]["kind"] == "compute"


def test_a_bad_launch_spec_is_bad_input(tmp_path, capsys):
    index = tmp_path / "nodes_compute.json"
    args = ["describe", "--out-dir", str(tmp_path), "--index", str(index), "--launch-json"]
    assert sysinfo.main([*args, '{"world_size": 0}']) == 2 and not index.exists()
    assert "system: error:" in capsys.readouterr().err
