"""Who may read what, and who published it: bearer tokens with per-dataset read scope
(:mod:`~hub.auth.tokens`), the managed token file (:mod:`~hub.auth.tokenstore`), the
short-lived signed read grants a spoke shows its peers (:mod:`~hub.auth.grants`) and
publisher signatures (:mod:`~hub.auth.signing`). It imports only the hub's ground leaves
(:mod:`hub.errors`, :mod:`hub.atomic`).
"""
