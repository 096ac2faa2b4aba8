"""``python -m spoke`` = ``strata-spoke``."""

from spoke.run.cli import main

if __name__ == "__main__":
    main()
