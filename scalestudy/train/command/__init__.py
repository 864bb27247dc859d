"""The command workload's rank program: the user's own training script under `python -m
scalestudy.train` (scalestudy.train.program hands it the run config it has read and checked), its
process tree and its progress files. The script's side of the contract is scalestudy.contract."""
