"""Everything that starts processes or times kernels for real (torch, gloo, FBGEMM, numpy):
microbenchmarks, fitting simulator parameters to them, cost-model data collection, probes and
validation against real runs. Results go to ``traces/`` with how they were measured."""
