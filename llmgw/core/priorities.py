"""Priority classes (issue 32): the names requests are queued under, shared by the router and the batch runner.

A request's class comes from its key or project (an operator sets it); a client may only lower its own class,
never raise it, by sending ``HEADER`` with a class ranked below its own (``batch`` is always allowed). The
batch runner sends every line of a batch as ``BATCH``. The admission queue serves classes in rank order and,
within a class, projects (keys without a project) by weight.
"""

from __future__ import annotations

#: The header a request names a (lower) class in.
HEADER = "X-Llmgw-Priority"
#: The default class of a request.
INTERACTIVE = "interactive"
#: Offline work: served only while interactive requests leave capacity.
BATCH = "batch"
