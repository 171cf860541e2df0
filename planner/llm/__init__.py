"""LLM planning: the layout search, placement across buildings, step metrics (time, MFU,
memory) and fidelity against published runs. Specs and layouts are in :mod:`planner.model.llm`,
the step's op graph in :mod:`planner.workloads.llm`."""
