"""The network for real: pairwise latency and bandwidth probes, a ring all-reduce over an emulated
network, and collective parameters fitted to nccl-tests tables."""
