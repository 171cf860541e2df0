"""Embedding tables: specs, shards, sharding plans, tasks, and the analytic cost and memory
models planners optimise."""
