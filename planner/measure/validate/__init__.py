"""Validate LLM plans against real ``torch.distributed`` runs (``clusterplan validate``).

See ``planner/measure/validate/README.md``. Importing this package does not import torch; the ranks
(:mod:`planner.measure.validate.worker`) do.
"""

from planner.measure.validate.config import RunConfig, Scale, load_source, run_config
from planner.measure.validate.report import validate

__all__ = ["RunConfig", "Scale", "load_source", "run_config", "validate"]
