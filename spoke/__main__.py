"""``python -m spoke`` = ``strata-spoke``."""

from spoke.cli import main

if __name__ == "__main__":
    main()
