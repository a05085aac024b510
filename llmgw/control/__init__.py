"""The control plane: desired state, the control loop that makes it so, and the APIs in front of it.

- ``cluster``: ``Cluster``, the control loop's front; its managers, one job each, in ``loop/``.
- ``reconcile/``: what a pass decides (``decide.reconcile``: observe, rollout, place, orphans), pure;
  ``placement/``: where a replica fits, pure; ``state``, ``status``, ``conditions``, ``events``: the pure
  vocabulary they share (``events`` are the cluster's event records, never a router's reports).
- ``store/``: the database (SQLite or PostgreSQL), ``Store`` assembled from one module per concern, its
  migrations with ``schemafloor`` (which releases may run on the schema, checked at start) and
  ``migrationlint`` (the floors checked from the migrations' source), and ``offloop`` (store calls on their
  own thread).
- ``leader``: the lease, one leader and standbys (``cpversions``: their llmgw versions told as events);
  ``agentsvc/``: the agents' gRPC stream (refusing an agent outside the skew policy, ``core.skew``) and the
  join port.
- ``http/``: the REST API, one module per resource; ``ui/``: the admin web UI; ``auth/``: who may call;
  ``sso/``: single sign-on through an OpenID Connect provider (the UI's and the CLI's flows, the refresher).
- ``routerreports`` (ejections, recoveries, keys used) and ``loadreports`` (load, the autoscaler's input):
  what routers report, read through ``llmgw.api.reports``; ``keyuse``: keys' "last used"; ``history``: the
  UI's charts, a day of what routers and agents report, per model and node, in the leader's memory.
- Also: ``engines`` (engine wants and settings), ``fabric`` (RDMA tests), ``remotemeta`` and ``netguard``
  (remote weights' metadata, reached safely), ``datadir`` and ``tokens`` (init and join tokens),
  ``auditprune``; ``backup/``: ``llmgw backup``/``restore`` and the server's scheduled backups; ``upgrades``
  (agents' upgrades under way and their health gate, the leader's, in memory); ``catalog/``: the model
  catalog and the deploy preview (a source's facts, the placer's dry run).

It never imports ``llmgw.agent`` or ``llmgw.router``: they meet on the wire (``llmgw.api``).
"""
