"""Built-in embedding-model specs for ``clusterplan plan``: ``criteo-dlrm``, ``mlperf-dcnv2``.

Load by name with :func:`planner.model.tables.spec_file.load_model_spec`; the YAML format is
documented in :mod:`planner.model.tables.spec_file`.
"""
