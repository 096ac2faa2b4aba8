"""``python -m spoke`` = ``strata-spoke``."""

import sys

from spoke.cli import main

if __name__ == "__main__":
    main()
