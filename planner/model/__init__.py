"""The training job as data: what is trained (LLM specs, embedding tables, DMT towers), how it
is laid out (``Layout``, sharding plans, tower layouts) and what each part costs and weighs.
No op graphs here (:mod:`planner.workloads`), no searches (the planners), no torch."""
