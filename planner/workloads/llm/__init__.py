"""One LLM training step as an op graph: stages, kernels, collectives, pipeline schedule."""
