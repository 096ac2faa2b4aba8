"""``python -m trainer``: the same command line as ``strata-train``.

The ``__main__`` guard matters: MDIO's ingest and the DataLoader start worker
processes with ``spawn``, which re-imports this module in each child.
"""

from trainer.cli import main

if __name__ == "__main__":
    main()
