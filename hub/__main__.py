"""``python -m hub``: the same as ``strata-hub``."""

import sys

from hub.cli.main import main

sys.exit(main())
