"""LLM training: model specs, parallel layouts, the step workload, memory, and metrics."""
