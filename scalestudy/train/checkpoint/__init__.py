"""A run's checkpoints: the manager the trainer calls (manager), and the two formats it writes:
one atomic file (single_file, the ResNet) or a DCP folder that reshards (dcp, the LM)."""
