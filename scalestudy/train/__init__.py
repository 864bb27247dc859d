"""The trainer (`python -m scalestudy.train`: program): the training loop (trainer), its checkpoints
(checkpoint/), its state and clocks (state), what it reports (results), data parallelism
(parallel), the optimizer (optim), the steady-state window (steady), the GPU monitor, the named
ranges of a step and the process settings. The workloads (scalestudy.workloads) give it data and
model."""
