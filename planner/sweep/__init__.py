"""Sweeps: one ``clusterplan`` command over a grid of arguments, locally or on Ray."""

from planner.sweep.grid import Point, SweepSpec, load_sweep, parse_sweep, points
from planner.sweep.run import result_table, run_point, run_sweep

__all__ = ["Point", "SweepSpec", "load_sweep", "parse_sweep", "points", "result_table",
           "run_point", "run_sweep"]
