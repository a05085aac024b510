"""The control plane's REST API, one module per resource; ``api.create_api`` assembles them.

- ``models`` (``modeldocs``): models applied, read, scaled, described, deleted; ``adapters``: ``kind: Adapter``.
- ``nodes`` (``nodedocs``): nodes listed, described, cordoned/uncordoned/drained, their logs;
  ``nodecerts``: their certificates and revocation; ``nodeupgrade``: their agents' upgrades.
- ``replicas``; ``events``; ``weights``; ``engines``; ``fabric`` (RDMA tests).
- ``routers``: what routers read and report (endpoints table, ejections, load signals);
  ``routercreds``: routers' credentials.
- ``keys`` (the OpenAI API's keys, each in a project), ``projects`` (projects, members, limits), ``users``,
  ``login``, ``tokens`` (join tokens), ``settings``, ``audit``.
- ``meta``: health, whoami, control planes; ``metrics``: Prometheus (``clustermetrics``: nodes, GPUs, replicas,
  leadership, certificates, read at each scrape); ``history``: a model's or node's recent history
  (``/api/v1/metrics/history``, the UI's charts); ``ca``: the cluster CA's certificate, for
  clients to pin (no credential).

Shared: ``schemas`` (response models), ``apierrors`` (the refusals; ``errors``: their JSON shape),
``paging`` (query bounds), ``apidocs`` (``/api/docs``), ``openapi`` (the checked-in ``docs/openapi.json``),
``forward`` (a standby's front to the leader). To add an endpoint: a route in its resource's module with a
``response_model`` from ``schemas``, refusals from ``apierrors``, then ``python -m llmgw.control.http.openapi
--write``.
"""
