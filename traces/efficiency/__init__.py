"""Compute-efficiency tables per GPU kind, read by :func:`simulator.compute.load_compute_profile`."""
