"""What a study trains: one package per workload, each with a `spec` module (its SPEC, a
scalestudy.plan.workload_spec.WorkloadSpec, standard library) and the code that builds its model
and data (the spec's runtime module, imported by the trainer through the spec; it may import torch).
The registry of the specs is scalestudy.plan.workloads."""
