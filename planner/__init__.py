"""clusterplan's planners and its command line; builds on :mod:`simulator`, never the reverse."""

__version__ = "0.1.0"
