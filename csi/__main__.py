"""``python -m csi`` = ``strata-csi``."""

from csi.cli import main

if __name__ == "__main__":
    main()
