"""The files of a run folder and the columns of its CSV files (docs/reference/files.md, "Run folder").

One home for them: the trainer and the GPU monitor write them, the rules declare them as outputs,
the analysis and the constructed study of scalestudy.analysis.constructed_study follow them.
Standard library only (the Snakefile imports it).
"""

SUMMARY = "summary.json"  # written last: a run folder with it is a finished run
METRICS = "metrics.csv"  # one row per epoch (METRICS_COLUMNS)
STEPS = "steps.csv"  # sampled steps' phase times (STEPS_COLUMNS)
GPU_MONITOR = "gpu_monitor.csv"  # the GPU samples (MONITOR_COLUMNS)
GPU_MONITOR_INFO = "gpu_monitor.json"  # the monitor's summary, or why there are no samples
PROFILE_OPS = "profile_ops.csv"  # a torch.profiler run's operator table
PROFILE_WINDOW = "profile_window.json"  # a profile run's window (tool, steps, wall time)
PROFILE_KERNELS = "profile_kernels.csv"  # a torch.profiler run's device kernels by launching range
# In a run's checkpoint_dir (kept over retries): the mark of a finished run, and the folder where
# another run config's checkpoints are set aside (superseded/<its config hash>/).
FINISHED_MARK = "finished.json"
SUPERSEDED = "superseded"
# The files every training run writes, by the name of the rule's output that declares each.
RUN_FILES = {"summary": SUMMARY, "metrics": METRICS, "steps": STEPS, "gpu_monitor": GPU_MONITOR}

METRICS_COLUMNS = (
    "epoch",
    "train_loss",
    "train_acc",
    "test_loss",
    "test_acc",
    "epoch_time_s",
    "images_per_s",
    "images_per_s_per_gpu",
    "global_batch",
    "per_gpu_batch",
    "world_size",
    "lr",
    "wall_time_s",
)
STEPS_COLUMNS = ("epoch", "step", "data_s", "forward_s", "backward_allreduce_s", "optimizer_s", "step_s")
MONITOR_COLUMNS = (
    "time_s",
    "host",
    "gpu_index",
    "gpu_uuid",
    "gpu_name",
    "rank",
    "sm_active_pct",
    "kernel_active_pct",
    "mem_util_pct",
    "power_w",
    "power_limit_w",
    "power_fraction",
    "pcie_rx_mb_s",
    "pcie_tx_mb_s",
    "mem_used_mb",
    "temperature_c",
    # contention (scalestudy.train.gpu_processes): compute processes on the GPU, those not the job's
    # and their memory; the host's 1-minute load and its CPUs
    "processes",
    "foreign_processes",
    "foreign_mem_mb",
    "host_load_1m",
    "host_cpus",
    # joules the GPU used since the monitor's first reading (NVML's energy counter; empty without one)
    "energy_j",
)
# profile_kernels.csv: each device kernel (or memory operation) of the profiling window by the
# trainer's named range whose op launched it ("data": the loader's; "" outside every range, as the
# backward's kernels, which autograd launches from its own thread); count and total device time.
PROFILE_KERNEL_COLUMNS = ("name", "range", "count", "device_us")
# profile_ops.csv: torch.profiler's operator table (key_averages), times in microseconds
PROFILE_OPS_COLUMNS = ("name", "count", "self_cpu_us", "cpu_total_us", "self_device_us", "device_total_us")
# summary.json's whole-run throughput (one-off costs included; None where the run has no steps)
WHOLE_RUN_KEYS = ("whole_run_images_per_s", "whole_run_images_per_s_per_gpu", "whole_run_step_time_s")
# what a table, summary or paper says of a quantity nothing measured (followed by ": <why>")
NOT_MEASURED = "not measured"
# summary.json's energy measures (scalestudy.analysis.energy): absent or None where not measured
ENERGY_MEASURES = (
    "energy_j",
    "energy_window_j",
    "mean_power_w",
    "joules_per_sample",
    "joules_per_sample_run",
    "energy_to_target_j",
    "gpu_hours",
    "gpu_hours_to_target",
)
