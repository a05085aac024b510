"""``llmgw server``'s settings: one dataclass, its flags, defaults and help written once here.

The fields are what the command line says (durations as written, files by name); ``serving.config``
resolves them into the ``ServerConfig`` that ``llmgw.serve.run`` starts from (files read, the lease
checked). The in-process router's settings are the standalone router's ``ProxySettings``, nested, so
the two take the same flags. Light on purpose: the CLI imports it to make its flags.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import ClassVar

from llmgw.control.reconcile import liveness
from llmgw.core import units
from llmgw.core.settingsgen import nested, setting
from llmgw.router.settings import AUTO_WORKERS_CAP, MAX_WORKERS, ProxySettings

_PORT = {"min": 0, "max": 65535}


@dataclasses.dataclass(frozen=True, slots=True)
class ServerSettings:
    """``llmgw server``: the control plane and the router in one process; validated when made."""

    #: Every setting without a variable of its own is also read from LLMGW_SERVER_<NAME> (``settingsgen``).
    ENV_PREFIX: ClassVar[str] = "LLMGW_SERVER_"

    host: str = setting("127.0.0.1", help="Address to listen on (0.0.0.0 for every interface)")
    http_port: int = setting(8080, **_PORT, help="OpenAI API, REST API and /metrics")
    agent_port: int = setting(8081, **_PORT, help="The agents' gRPC stream (mutual TLS)")
    join_port: int = setting(8082, **_PORT, help="Where `llmgw agent join` reaches this server with a token (TLS; "
                                                 "not with --insecure)")
    tunnel_port: int = setting(8083, **_PORT, help="Where agents of nodes behind NAT (engine_access tunnel or "
                                                   "auto) dial the tunnel their engines are reached through (mutual "
                                                   "TLS; not with --insecure); the port is offered to them over "
                                                   "their stream. 0: a free one")
    data_dir: Path | None = setting(None, help="Database and cluster CA directory, initialised on first start "
                                               "[default $XDG_DATA_HOME/llmgw]")
    ports_file: Path | None = setting(None, help="Write the bound ports here as JSON once listening")
    database: str = setting("", env="LLMGW_DATABASE", help="The store's database URL, e.g. "
                            "postgresql+psycopg://USER[:PASSWORD]@HOST:PORT/DB (migrated at start, once under a "
                            "lock) [default: SQLite in the data directory]")
    advertise_address: str = setting("", help="The host other machines reach this server by: agents are sent to "
                                     "HOST:AGENT_PORT and a standby forwards the REST API to http(s)://HOST:HTTP_PORT "
                                     "when this one leads [default: --host, or this machine's FQDN when --host is a "
                                     "wildcard]")
    sso_redirect_url: str = setting("", help="Where the identity provider sends browsers back after a UI sign-in "
                                    "(single sign-on), as registered at the provider, e.g. https://llmgw.example.com"
                                    "/ui/sso/callback [default: the browser's own address when its host is one of "
                                    "this server's names (--host, --advertise-address, this machine's, loopback); "
                                    "set it behind a proxy]")
    lease: str = setting("6s", help="How long the leader's lease lasts past its last renewal: a dead leader is "
                                    "replaced within about this long (several servers on one --database)")
    lease_renew: str = setting("1s", help="How often the leader renews its lease and a standby tries to take it")
    insecure: bool = setting(False, help="Loopback development only: no authentication on the REST API, a "
                                         "plaintext agent stream, no join port (refused with a --host that is not "
                                         "loopback)")
    tls: bool = setting(False, help="HTTPS on the HTTP port on loopback too (beyond loopback it is the default), "
                                    "with a certificate from the cluster CA unless --tls-cert/--tls-key are given")
    plain_http: bool = setting(False, help="Plain HTTP on a --host beyond loopback, for a server behind a "
                                           "TLS-terminating proxy: warned at start, and every answer says so "
                                           "(X-Llmgw-Plain-Http: 1)")
    tls_cert: Path | None = setting(None, metavar="FILE", help="The HTTP port's certificate (PEM: the server's, "
                                    "then its intermediates), e.g. a public one; re-read when it changes, "
                                    "without a restart. With --tls-key [default: one from the cluster CA]")
    tls_key: Path | None = setting(None, metavar="FILE", help="The private key of --tls-cert (PEM, unencrypted; "
                                   "keep it 0600); re-read with it")
    tls_san: tuple[str, ...] = setting((), metavar="NAME", help="A host name or IP address clients reach the HTTP "
                                       "port by, put in its cluster-CA certificate beside --advertise-address, "
                                       "--host and the loopback names; repeatable")
    tls_cert_validity: str = setting("90d", help="How long the HTTP port's cluster-CA certificate is valid; it is "
                                                 "issued again at two thirds, or when the names change")
    node_cert_validity: str = setting("365d", help="How long a node's certificate is valid, e.g. 720h, 30s; agents "
                                                   "renew it at two thirds, over their stream")
    node_grace: float = setting(30.0, help="Seconds a disconnected node keeps its replicas")
    unhealthy_grace: float = setting(liveness.UNHEALTHY_GRACE_S,
                                     help="Seconds a replica whose engine its agent calls Unhealthy (alive, not "
                                          "answering) stays so before it is replaced")
    weights_gc_free_below: float = setting(10.0, help="Remove fetched weights no model asks for, least recently "
                                           "used first, from a node whose weights directory has less than this "
                                           "percent free (0: never)")
    sleep_overcommit: float = setting(1.0, help="spec.idle: a GPU whose replicas all sleep is offered to another "
                                      "replica while every replica on it stays within the GPU's memory times this "
                                      "(1: never; at most 8)")
    hub_endpoint: str = setting("", help="The Hugging Face-compatible endpoint nodes fetch hf:// sources from: the "
                                "hub, or the cluster's mirror [default: this server's /mirror with --mirror-dir, "
                                "else https://huggingface.co]")
    mirror_url: str = setting("", help="The cluster mirror's base URL, for mirror:// sources [default: this "
                                       "server's /mirror with --mirror-dir]")
    mirror_dir: Path | None = setting(None, help="Serve this directory of weights as the cluster's mirror at "
                                      "/mirror on the HTTP port (admin API token from LLMGW_MIRROR_ADMIN_TOKEN) "
                                      "[default: no mirror here]")
    mirror_upstream: str = setting("", help="With --mirror-dir: pull missing files through from this "
                                   "HF-compatible endpoint, once per file for the cluster, e.g. "
                                   "https://huggingface.co [default: off]")
    fetch_allow_private: tuple[str, ...] = setting((), help="A host or HOST:PORT the control plane's reads of "
                                                   "remote sources may reach although it is loopback, link-local or "
                                                   "this host's own ('*': any); repeatable [default: none; the hub "
                                                   "and mirror are trusted]")
    catalog: Path | None = setting(None, metavar="FILE", help="The model catalog the UI's Deploy page and `llmgw "
                                   "catalog` list (YAML, the shape of llmgw/control/catalog/models.yaml) [default: "
                                   "the catalog shipped with llmgw]")
    hub_token_file: Path | None = setting(None, help="A file holding the hub's token, sent only to nodes fetching "
                                          "an hf:// source (without it: the LLMGW_HF_TOKEN environment variable); a "
                                          "token is never given on the command line")
    engine_index: str | None = setting(None, help="The package index nodes install engines from: a pip simple "
                                       "index URL, or with --engine-find-links a wheelhouse page (the llmgw "
                                       "mirror's); never the public index unless named here [given: stored, and "
                                       "wins over the stored value; default: the stored value, else none]")
    engine_find_links: bool = setting(False, help="With --engine-index: it is a page of wheel links (pip "
                                                  "--find-links), not a simple index")
    model_installs: bool | None = setting(None, flag="--model-installs/--no-model-installs", help="Whether a "
                                          "model's engine_version makes a node that lacks it install it [given: "
                                          "stored, and wins; default: the stored value, else yes]")
    engine_os_packages: bool | None = setting(None, flag="--engine-os-packages/--no-engine-os-packages",
                                              help="Whether agents running as root install the OS packages an "
                                              "engine (or perftest) needs with apt-get/dnf; otherwise they report "
                                              "them with the command [given: stored, and wins; default: the stored "
                                              "value, else no]")
    router: ProxySettings = nested(ProxySettings)
    router_workers: int = setting(0, metavar="N", min=0, max=MAX_WORKERS,
                                  help="Processes accepting on the HTTP port together (SO_REUSEPORT): this one and "
                                       "N-1 router workers, which serve the OpenAI API themselves and pass every "
                                       "other request to this one; one table, exact limits and metering across "
                                       f"them; 1: this process alone [default 0: the number of cores, at most "
                                       f"{AUTO_WORKERS_CAP}]")
    audit_retention: str = setting("90d", help="How long the audit log keeps an entry, e.g. 90d, 720h; the leader "
                                               "deletes older ones")
    usage_minute_retention: str = setting("2d", help="How long per-minute usage rollups are kept, e.g. 2d, 48h")
    usage_hour_retention: str = setting("90d", help="How long per-hour usage rollups are kept")
    usage_day_retention: str = setting("400d", help="How long per-day usage rollups are kept")
    request_log_retention: str = setting("0s", help="How long the per-request usage log keeps a request, e.g. 7d "
                                                    "[default 0s: no per-request log, only rollups]")
    budget_webhook_url: str = setting("", help="POST each budget's crossing of 80 and 100 percent of its limit "
                                               "as JSON to this URL, retried with backoff [default: no webhook]")
    budget_webhook_secret_file: Path | None = setting(None, help="A file holding the secret the budget webhook's "
                                                      "body is signed with (X-Llmgw-Signature: sha256=HMAC); a "
                                                      "secret is never given on the command line")
    files_max_bytes: int = setting(200 << 20, metavar="BYTES", min=1, help="The largest file /v1/files takes "
                                   "(a batch's input, issue 32)")
    files_max_per_project: int = setting(1000, metavar="N", min=0, help="How many files a project may keep in "
                                         "/v1/files (0: no limit); a batch's output files do not count")
    files_max_bytes_per_project: int = setting(10 << 30, metavar="BYTES", min=0, help="How many bytes of files a "
                                               "project may keep in /v1/files (0: no limit)")
    sso_issuer: str = setting("", help="Single sign-on: the OpenID Connect provider's issuer URL, e.g. "
                              "https://idp.example.com/realms/main (its /.well-known/openid-configuration is read) "
                              "[default: no single sign-on]")
    sso_client_id: str = setting("", help="Single sign-on: llmgw's client id at the provider")
    sso_client_secret_file: Path | None = setting(None, help="Single sign-on: a file (mode 0600) holding the "
                                                  "client's secret; a secret is never given on the command line")
    sso_scopes: str = setting("openid profile email groups offline_access", help="Single sign-on: the scopes "
                              "asked for, space-separated (openid is required)")
    sso_groups_claim: str = setting("groups", help="Single sign-on: the ID token's claim holding the user's groups")
    sso_username_claim: str = setting("preferred_username", help="Single sign-on: the claim a user's llmgw name "
                                      "comes from (sub when the token lacks it)")
    sso_role_map: tuple[str, ...] = setting((), help="Single sign-on: GROUP=ROLE (viewer, operator, admin): members "
                                            "of GROUP get ROLE (the strongest of their groups'); repeatable")
    sso_project_map: tuple[str, ...] = setting((), help="Single sign-on: GROUP=PROJECT[:ROLE] (viewer, member, "
                                               "owner; default member): members of GROUP belong to PROJECT; "
                                               "repeatable")
    sso_mapping_file: Path | None = setting(None, help="Single sign-on: a YAML or JSON file {roles: {GROUP: ROLE}, "
                                            "projects: {GROUP: {PROJECT: ROLE}}} (the flags win on a group both "
                                            "name)")
    sso_refresh_interval: str = setting("5m", help="Single sign-on: how often each user's refresh token is used; a "
                                        "user whose provider session ended or whose groups no longer map loses "
                                        "access within this plus a quarter of it (at most 30s) plus one pass")
    backup_dir: Path | None = setting(None, help="Scheduled backups: write one here (outside the data directory; "
                                      "another disk or a mounted share) every --backup-every, as `llmgw backup` "
                                      "does; only the leader does [default: no scheduled backups]")
    backup_every: str = setting("6h", help="Scheduled backups: how long after the newest one the next is due, "
                                           "e.g. 6h, 1d")
    backup_keep: int = setting(7, min=1, help="Scheduled backups: how many of the newest to keep; older ones "
                                              "that a scheduled backup wrote (its name and header) are deleted")
    backup_passphrase_file: Path | None = setting(None, help="Scheduled backups: a file (mode 0600) whose first "
                                                  "line is the passphrase they are encrypted with; a passphrase "
                                                  "is never given on the command line")
    log_level: str = setting("info", help="The log level: debug, info, warning, error")

    def __post_init__(self) -> None:
        """ValueError with the sentence the CLI prints, naming the flag."""
        if not 0 <= self.router_workers <= MAX_WORKERS:
            raise ValueError(f"--router-workers: expected 0 (one per core) to {MAX_WORKERS}, got {self.router_workers}")
        if self.node_grace < 0:
            raise ValueError("--node-grace cannot be negative")
        if self.unhealthy_grace < 0:
            raise ValueError("--unhealthy-grace cannot be negative")
        if not 0 <= self.weights_gc_free_below < 100:
            raise ValueError(f"--weights-gc-free-below {self.weights_gc_free_below:g}: a percent from 0 (never) to "
                             "below 100")
        if not 1.0 <= self.sleep_overcommit <= 8.0:
            raise ValueError(f"--sleep-overcommit {self.sleep_overcommit:g}: a factor from 1 (never over-commit) "
                             "to 8")
        if self.tls_cert_validity_s <= 0:
            raise ValueError("--tls-cert-validity must be longer than 0s, e.g. 90d")
        if self.node_cert_validity_s <= 0:
            raise ValueError("--node-cert-validity must be longer than 0s")
        if self.audit_retention_s <= 0:
            raise ValueError("--audit-retention must be longer than 0s, e.g. 90d")
        self.lease_s, self.lease_renew_s  # noqa: B018  (ValueError naming the flag)
        for flag, seconds in (("--usage-minute-retention", self.usage_minute_retention_s),
                              ("--usage-hour-retention", self.usage_hour_retention_s),
                              ("--usage-day-retention", self.usage_day_retention_s)):
            if seconds <= 0:
                raise ValueError(f"{flag} must be longer than 0s, e.g. 2d")
        self.request_log_retention_s  # noqa: B018
        if self.sso_redirect_url and not self.sso_redirect_url.startswith(("http://", "https://")):
            raise ValueError(f"--sso-redirect-url {self.sso_redirect_url!r}: expected the http(s):// URL of this "
                             "server's /ui/sso/callback, as registered at the identity provider")
        if self.budget_webhook_url and not self.budget_webhook_url.startswith(("http://", "https://")):
            raise ValueError(f"--budget-webhook-url {self.budget_webhook_url!r}: expected an http(s):// URL")
        if self.engine_find_links and self.engine_index is None:
            raise ValueError("--engine-find-links says what --engine-index is: give --engine-index URL with it")
        if self.engine_index and not self.engine_index.startswith(("http://", "https://", "file:")):
            raise ValueError(f"--engine-index {self.engine_index!r}: expected an http(s):// URL of a pip index or "
                             "wheelhouse page")
        if self.mirror_upstream and self.mirror_dir is None:
            raise ValueError("--mirror-upstream needs --mirror-dir: the directory the mirror keeps what it pulls "
                             "through")
        if self.sso_refresh_interval_s <= 0:
            raise ValueError("--sso-refresh-interval must be longer than 0s, e.g. 5m")
        sso_given = [f for f, v in (("--sso-client-id", self.sso_client_id),
                                    ("--sso-client-secret-file", self.sso_client_secret_file)) if v]
        if self.sso_issuer and len(sso_given) < 2:
            raise ValueError("--sso-issuer needs --sso-client-id and --sso-client-secret-file: the client "
                             "registered for llmgw at the provider")
        if sso_given and not self.sso_issuer:
            raise ValueError(f"{sso_given[0]} needs --sso-issuer: the provider's issuer URL")
        if self.sso_issuer and not self.sso_issuer.startswith(("https://", "http://")):
            raise ValueError(f"--sso-issuer {self.sso_issuer!r}: expected the provider's https:// issuer URL")
        if self.sso_issuer and "openid" not in self.sso_scopes.split():
            raise ValueError(f"--sso-scopes {self.sso_scopes!r}: must include openid (the ID token is what "
                             "proves the user)")
        if (self.backup_dir is None) != (self.backup_passphrase_file is None):
            raise ValueError("--backup-dir and --backup-passphrase-file go together: the directory scheduled backups "
                             "go to and the passphrase they are encrypted with")
        if self.backup_dir is not None and self.insecure:
            raise ValueError("--backup-dir with --insecure: an --insecure server has no cluster CA to back up; "
                             "leave --insecure out (or --backup-dir, for loopback development)")
        if self.backup_every_s < 1:
            raise ValueError("--backup-every must be at least 1s, e.g. 6h")
        if self.backup_keep < 1:
            raise ValueError("--backup-keep must be at least 1")
        if self.mirror_upstream and not self.mirror_upstream.startswith(("http://", "https://")):
            raise ValueError(f"--mirror-upstream {self.mirror_upstream!r}: expected http(s)://HOST[:PORT], e.g. "
                             "https://huggingface.co")

    @property
    def router_worker_count(self) -> int:
        """How many processes accept on the HTTP port: ``router_workers``, or with 0 the cores, at most the cap."""
        return self.router_workers or max(1, min(os.cpu_count() or 1, AUTO_WORKERS_CAP))

    @property
    def tls_cert_validity_s(self) -> float:
        return _seconds("--tls-cert-validity", self.tls_cert_validity)

    @property
    def node_cert_validity_s(self) -> float:
        return _seconds("--node-cert-validity", self.node_cert_validity)

    @property
    def audit_retention_s(self) -> float:
        return _seconds("--audit-retention", self.audit_retention)

    @property
    def usage_minute_retention_s(self) -> float:
        return _seconds("--usage-minute-retention", self.usage_minute_retention)

    @property
    def usage_hour_retention_s(self) -> float:
        return _seconds("--usage-hour-retention", self.usage_hour_retention)

    @property
    def usage_day_retention_s(self) -> float:
        return _seconds("--usage-day-retention", self.usage_day_retention)

    @property
    def request_log_retention_s(self) -> float:
        return _seconds("--request-log-retention", self.request_log_retention)

    @property
    def sso_refresh_interval_s(self) -> float:
        return _seconds("--sso-refresh-interval", self.sso_refresh_interval)

    @property
    def backup_every_s(self) -> float:
        return _seconds("--backup-every", self.backup_every)

    @property
    def lease_s(self) -> float:
        return _seconds("--lease/--lease-renew", self.lease)

    @property
    def lease_renew_s(self) -> float:
        return _seconds("--lease/--lease-renew", self.lease_renew)


def _seconds(flag: str, value: str) -> float:
    try:
        return units.parse_duration(value)
    except ValueError as e:
        raise ValueError(f"{flag}: {e}") from None
