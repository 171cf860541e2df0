"""clusterplan's discrete-event simulator of training steps on a cluster topology.

Layers, bottom up: ``units`` and ``errors`` (SI quantities, user-facing errors); ``hardware``
(GPU catalog) and ``compute`` (roofline op times); ``topology`` (YAML schema, generators, the
networkx graph); ``network`` (routing and max-min fair flow sharing); ``collectives`` (collective
algorithms as flows); ``engine`` (a SimPy DAG executor over per-device streams) and ``trace``
(Chrome/Perfetto timelines). The planner builds on this package; this package never imports it.
"""

__version__ = "0.1.0"
