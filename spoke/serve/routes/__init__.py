"""The admin API's routes, one :class:`fastapi.APIRouter` per resource: prewarm jobs
(:mod:`.jobs`), pins (:mod:`.pins`), read-order hints (:mod:`.hints`), the cache and its
eviction (:mod:`.cache`), and the open probes and metrics (:mod:`.health`). Each route takes
what it needs from the :class:`~.context.AdminContext` in ``app.state`` (a dependency);
:func:`spoke.serve.admin.create_app` puts them together.
"""
