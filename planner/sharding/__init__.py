"""Embedding-table sharding: specs, layouts, memory, cost, planners, plans, simulation."""
