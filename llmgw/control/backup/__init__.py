"""Backup and restore of a control plane's cluster (issue 29): one sealed file, put back on a new machine.

- ``sealed``: the file's format (a clear header, then AES-256-GCM chunks under a scrypt key), written
  0600 and atomically, read chunk by chunk, refusing a wrong passphrase, a damaged or cut-short file;
- ``database``: the store's consistent copy (SQLite's online backup, ``pg_dump``) and ``pg_restore``;
- ``archive``: what a backup holds (``make``) and putting it back in a new data directory (``restore``);
- ``schedule``: the server's scheduled backups (``--backup-dir``, ``--backup-every``, ``--backup-keep``),
  on the leader only, and their retention.
"""
