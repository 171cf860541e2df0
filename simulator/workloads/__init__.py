"""Built-in example workloads (YAML), loadable by name: see simulator.workload_spec."""
