"""Model + plan → the simulator's op graph (:class:`simulator.workload.Workload`): the only
layer that knows both the job (:mod:`planner.model`) and the simulator's op vocabulary."""
