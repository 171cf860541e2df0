"""The ``clusterplan`` command line: :mod:`planner.cli.main` builds the parser from one module
per command (each ``register(subparsers)`` and ``run(args)``); :mod:`planner.cli.output` and
:mod:`planner.cli.options` are the helpers they share."""
