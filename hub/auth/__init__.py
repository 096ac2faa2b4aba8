"""Who may read what, and who published it: bearer tokens with per-dataset read scope
(:mod:`~hub.auth.tokens`), the managed token file (:mod:`~hub.auth.tokenstore`), the
short-lived signed read grants a spoke shows its peers (:mod:`~hub.auth.grants`) and
publisher signatures (:mod:`~hub.auth.signing`), both keys read one way
(:mod:`~hub.auth.keys`). It imports only the hub's ground leaves
(:mod:`hub.errors`) and :mod:`strata_local.atomic`.
"""
