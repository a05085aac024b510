"""The weights mirror: a directory of weights served over HTTP for an offline cluster.

``llmgw mirror --dir DIR`` serves ``mirror://name/...`` content at ``/files/<name>/<path>`` and, for
``hf://`` sources, the part of the Hugging Face Hub's HTTP API that ``huggingface_hub`` uses to resolve a
revision, list its files and download one (so ``HF_ENDPOINT=<mirror>`` works for the client itself and for
engines that download). With ``--upstream URL`` it is a pull-through cache: a file it lacks is fetched once
from the upstream and streamed to every asker while it arrives.

Modules: ``paths`` (the one place a request's path becomes a filesystem path), ``store`` (the layout on
disk and each revision's cached file metadata), ``upstream`` (the one owner of calls to the upstream),
``pull`` (single-flight downloads that readers follow as they grow), ``app`` (the ASGI app; ``build()``
returns it, for ``llmgw mirror`` or to mount in another server) and ``server`` (uvicorn around it).
"""
