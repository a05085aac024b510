"""Usage and quotas on the control plane (issue 26): routers' usage batches stored once, their quota syncs
answered out of the ledger, thresholds announced (event, audit row, metric, webhook), old rows pruned.

``service.UsageService`` is what routers reach: in process through its two coroutines, standalone through
``control.http.routerusage``. The arithmetic is ``core.quota``'s and the SQL ``control.store``'s.
"""
