"""DLRM steps with DMT's semantic-preserving tower transform (SPTT): the op graph
(:mod:`~planner.workloads.dmt.sptt`) and the step simulated beside the flat one
(:mod:`~planner.workloads.dmt.step`)."""
