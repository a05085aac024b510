"""The model catalog and the deploy preview ("Deploy a model", ``llmgw plan``, ``POST /api/v1/preview``).

* ``entries``: the catalog file (a shipped ``models.yaml`` of well-known open models, or the operator's own,
  ``llmgw server --catalog FILE``), read and checked;
* ``facts``: what a source's files say (remote: read by ``llmgw.control.remotemeta`` through the cluster's hub
  or mirror; a path: what the nodes' agents reported of it, never a file the control plane opens);
* ``dryrun``: where the placer would put it, and each other node's reason, with nothing applied or stored.
"""
