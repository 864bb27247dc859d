"""The user's own training script (scalestudy.workloads.command.runner runs it on every rank), counted in
the unit its config names (workload.command.sample_unit), its data and optimizer its own."""

from __future__ import annotations

from scalestudy.plan.workload_spec import NO_DATA, SCRIPT_WORDS, WorkloadSpec

SPEC = WorkloadSpec(
    name="command",
    sample_unit="samples",
    metric="none",
    data=NO_DATA,
    model_keys=(),
    reshardable=False,
    runtime="scalestudy.workloads.command.runner",
    default_optimizer=None,
    parallelisms=(),
    entry="scalestudy.workloads.command.runner:run",
    run_section="scalestudy.workloads.command.section",
    section_required=(("script", "the script to run"),),
    section_files=("script",),
    paper=SCRIPT_WORDS,
    ignores=(("micro_batch", "gradient accumulation is the trainer's, and your script runs its own steps"),),
)
