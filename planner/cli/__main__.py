"""``python -m planner.cli`` is ``clusterplan``."""

import sys

from planner.cli.main import main

sys.exit(main())
