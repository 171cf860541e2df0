"""Code that makes clusterplan impossible to import in a child Python process: a trainer's
process must run exported plans with torch and TorchRec alone."""

#: put first in a child's script: any import of ``planner`` or ``simulator`` then fails
NO_CLUSTERPLAN = """
import importlib.abc, sys

class NoClusterplan(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("planner", "simulator"):
            raise ImportError(f"{name} must not be needed")

sys.meta_path.insert(0, NoClusterplan())
"""
