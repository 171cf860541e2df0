"""Learned (NeuroShard-style) cost model for embedding-table sharding: data collection on this
hardware, a torch cost network beside a gradient-boosting baseline, shipped weights and the
``neuroshard`` planner's greedy grid search. See README.md in this directory."""
