"""Validate LLM plans against real ``torch.distributed`` runs (``clusterplan validate``).

See ``planner/validate/README.md``. Importing this package does not import torch; the ranks
(:mod:`planner.validate.worker`) do.
"""

from planner.validate.config import RunConfig, Scale, load_source, run_config
from planner.validate.report import validate

__all__ = ["RunConfig", "Scale", "load_source", "run_config", "validate"]
