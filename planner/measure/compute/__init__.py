"""Compute microbenchmarks: GPU kernels and blocks (torch, on a lent GPU), this CPU (numpy),
eager PyTorch's host time per block; and fitting efficiency curves to them."""
