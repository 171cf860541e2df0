"""Embedding tables for real: fused TBE kernels per rank, the all-to-alls of a plan on gloo,
whole plans measured, the CPU profile of the cost model fitted, cost-model data collected."""
