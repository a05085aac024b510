"""The control loop's managers, one job each, stepped in order by ``control.cluster.Cluster``.

A pass reads, decides, writes the targets, then sends:

- ``links``: the stream to each agent; closes the silent ones first, sends commands, logs, revocations.
- ``nodes``: the nodes as agents report them and the operator marks them; says NotReady past the grace.
- ``autoscaling``: each autoscaled model's replica count, from the routers' load reports.
- ``planner``: the pure part of a pass (autoscaling, ``reconcile.decide.reconcile``, the recorder's
  derivation, each node's Provision), handed a ``plan.Plan`` to fill.
- ``recorder``: event records (``control.events``) and conditions, as a pass changed them.
- ``executor``: the targets written to the store, then the commands sent to the agents.
- ``table``: the routers' endpoints table, published after every pass, and its long poll.
- ``context``: what they all share (the store and where its calls run, the clock, whether this leads).

In ``llmgw server`` nothing here holds the event loop that the agents' streams, the REST API and the
in-process router share: store calls go to the store's thread (``store.offloop``; writes nobody waits on
are queued there in order), and the planner runs in a worker thread on a snapshot of the nodes taken on the
loop (why that copy is consistent: ``nodes``). Without a store thread (unit tests, ``Cluster(store)``)
every call runs inline.
"""
