"""DMT (Disaggregated Multi-Tower) tower layouts: SPTT in the simulator, Tower Module, Tower
Partitioner, ``clusterplan plan --dmt``. See README.md beside this file."""

from planner.model.dmt.layout import Tower, TowerLayout
from planner.model.dmt.module import TowerModuleSpec

__all__ = ["TowerModuleSpec", "Tower", "TowerLayout"]
