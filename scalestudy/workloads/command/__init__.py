"""The user's own training script (`workload: command`): its runner (`python -m
scalestudy.workloads.command`), its progress files and the contract a script follows. Standard
library only, as is the contract."""
