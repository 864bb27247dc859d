"""The user's own training script as a workload: its rank program under `python -m scalestudy.train`
(runner: scalestudy.train.program hands it the run config it has read and checked), its process tree
and its progress files. The script's side of the contract is scalestudy.contract."""
