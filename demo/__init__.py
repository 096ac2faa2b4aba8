"""The demo (``strata-demo``, ``python -m demo``): the whole system on one machine.

It composes the others and nothing imports it: the local process harness
(:mod:`deploy.local`), the WAN emulator (:mod:`bench.wan`) and the trainer runner
(:mod:`bench.measure`), which itself starts stacks through :mod:`deploy.local`. The order
is one way, demo → bench → deploy; an import-linter contract keeps it so.
"""
