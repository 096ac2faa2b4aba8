"""``strata-hub``: the app and its serve and publish commands (:mod:`~hub.cli.main`), the
commands on an existing catalog (:mod:`~hub.cli.catalog`), token management
(:mod:`~hub.cli.tokens`), ``serve``'s settings schema (:mod:`~hub.cli.settings`) and what
they share (:mod:`~hub.cli.options`). The top floor: it may import every room; nothing
imports it.
"""
