"""OpenAI Files and Batches (issue 32), served by the control plane on the OpenAI API's port.

- ``config``: the limits and quotas (``FilesConfig``), from ``llmgw server``'s settings;
- ``blobs``: where a file's bytes are: a 0600 file of the data directory named by its id (SQLite), or chunk rows
  of the database (PostgreSQL, so that every control plane reaches them);
- ``inputs``: a batch's input file read line by line into lines to run and invalid ones (never failing the batch);
- ``objects``: the File and Batch objects as OpenAI writes them (pydantic models);
- ``service``: ``BatchService``: files, batches, the routers' claims and results, and ``step`` (on the leader:
  validating to in_progress, the output and error files written when a batch is done, cancelled or expired);
- ``http``: ``/v1/files`` and ``/v1/batches`` (an ASGI app, llmgw API keys, a key sees its project's only).
"""
