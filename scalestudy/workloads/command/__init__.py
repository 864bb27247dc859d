"""The user's own training script as a workload; its runner is scalestudy.train.command."""
