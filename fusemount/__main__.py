"""``python -m fusemount`` = ``strata-mount``."""

import sys

from fusemount.cli import main

if __name__ == "__main__":
    sys.exit(main())
