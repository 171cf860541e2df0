"""Built-in embedding-model specs for ``clusterplan plan``: ``criteo-dlrm``, ``mlperf-dcnv2``.

Load by name with :func:`planner.sharding.spec.load_model_spec`; the YAML format is documented in
:mod:`planner.sharding.spec`.
"""
