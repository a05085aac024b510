"""Weights fetching on the agent: ``Fetcher`` downloads remote sources into the weights cache.

See ``fetching`` for the design; ``records`` holds the plain data callers pass and get back; ``trust``: what
https:// fetches (and pip) verify with: the system's authorities and the cluster CA; ``transfer``: one file's
resumable GET into the partial area; ``partial``: the partial files themselves (hashed as written) and their sidecar.
"""

from llmgw.agent.fetch.fetching import Fetcher, free_bytes
from llmgw.agent.fetch.records import Held, Progress, Request

__all__ = ["Fetcher", "Held", "Progress", "Request", "free_bytes"]
