"""``python -m demo``: the same as ``strata-demo``."""

import sys

from demo.cli import main

sys.exit(main())
