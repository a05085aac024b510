"""``llmgw server``'s settings resolved into what it starts from: files read, the lease checked, hosts checked.

``ServerSettings`` (``serving.settings``) is what the command line says; :func:`config_of` makes the
:class:`ServerConfig` that ``llmgw.serve.run`` takes from it. The defaults are ``ServerSettings``'s.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import re
from collections.abc import Mapping
from pathlib import Path

from llmgw.control import leader as leader_mod
from llmgw.control.backup import schedule as backup_schedule
from llmgw.control.backup import sealed
from llmgw.control.batches.config import FilesConfig
from llmgw.control.catalog import entries as catalog_entries
from llmgw.control.reconcile import decide
from llmgw.control.sso import config as sso_config
from llmgw.control.usage.config import UsageConfig, usage_config
from llmgw.core.errors import LlmgwError
from llmgw.mirror import settings as mirror_settings
from llmgw.router.settings import ProxySettings
from llmgw.serving.settings import ServerSettings

log = logging.getLogger("llmgw.serve")

_D = ServerSettings()


@dataclasses.dataclass(frozen=True, slots=True)
class ServerConfig:
    host: str = _D.host
    http_port: int = _D.http_port
    agent_port: int = _D.agent_port
    data_dir: Path = Path(".")
    #: Where to write {"http_port", "agent_port"} once listening (for ``up`` and tests with port 0).
    ports_file: Path | None = None
    #: Seconds a disconnected node keeps its replicas before they are placed elsewhere.
    node_grace_s: float = _D.node_grace
    #: Seconds a shard its agent calls Unhealthy stays so before it is replaced
    #: (``control.reconcile.liveness.UNHEALTHY_GRACE_S`` says why 30).
    unhealthy_grace_s: float = _D.unhealthy_grace
    #: Fetched weights no model asks for go from nodes with less than this percent free (``weightsgc``).
    weights_gc_free_below_pct: float = _D.weights_gc_free_below
    #: ``--sleep-overcommit`` (``placement/overcommit``).
    sleep_overcommit: float = _D.sleep_overcommit
    #: Where nodes fetch remote weights from, and the hub's token (``hub_settings``).
    hub: decide.Hub = decide.Hub()
    #: The weights mirror served at ``/mirror`` on the HTTP port (None: not served here).
    mirror: MirrorConfig | None = None
    #: Hosts (host or host:port, "*": any) the control plane's remote reads may reach although they are
    #: loopback, link-local or its own (``--fetch-allow-private``; ``control.netguard``).
    fetch_allow_private: tuple[str, ...] = ()
    #: The model catalog (``--catalog``, read and checked at start); None: the shipped one.
    catalog: tuple[catalog_entries.Entry, ...] | None = None
    #: Loopback development only: the agent port plaintext, no join port, any node id (and REST open).
    insecure: bool = False
    #: Where `llmgw agent join` reaches the control plane (TLS, server-auth only; 0 picks a free port).
    join_port: int = _D.join_port
    #: Where agents behind NAT dial their engine tunnel (issue 33; mutual TLS, 0 picks a free port).
    tunnel_port: int = _D.tunnel_port
    #: How long a node certificate is valid; agents renew at two thirds over their stream.
    node_cert_validity_s: float = _D.node_cert_validity_s
    #: How long the audit log keeps an entry; the leader prunes older ones (``control.auditprune``).
    audit_retention_s: float = _D.audit_retention_s
    #: The engine package index (``--engine-index``): None keeps the stored setting; given, it is stored and wins.
    engine_index: str | None = None
    #: With ``engine_index``: it is a wheelhouse page (pip --find-links), not a simple index.
    engine_find_links: bool = False
    #: Whether models' engine_version may trigger installs: None keeps the stored setting (default yes).
    model_installs: bool | None = None
    #: Whether root agents install the OS packages engines (and perftest) need; None: the stored setting (off).
    engine_os_packages: bool | None = None
    #: The store's SQLAlchemy URL, e.g. ``postgresql+psycopg://USER@HOST:PORT/DB`` (``--database``);
    #: "" keeps SQLite in the data directory.
    database: str = ""
    #: The host agents and other control planes reach this one by ("": --host, or the FQDN on a wildcard).
    advertise: str = ""
    #: The UI's SSO callback URL as registered at the provider (``--sso-redirect-url``); "": from the request.
    sso_redirect_url: str = ""
    #: The leader lease's timings (several servers on one database; one alone takes it at once).
    lease: leader_mod.Timing = leader_mod.Timing()
    #: The in-process router's settings: body size, keepalive, admission, tracing, the HTTP server's limits.
    router: ProxySettings = ProxySettings()
    #: Processes accepting on ``http_port``: this one and ``router_processes - 1`` router workers
    #: (``serving.routerworkers``); 1: this one alone.
    router_processes: int = 1
    #: Usage retention per grain, the request log's, the budget webhook (``control.usage.config``).
    usage: UsageConfig = UsageConfig()
    #: /v1/files' limits (issue 32); where the bytes go is decided at start (``serving.batches``).
    files: FilesConfig = FilesConfig()
    #: How the HTTP port is served: HTTPS (and with which certificate) or plain (``tls_plan``).
    tls: TlsPlan = dataclasses.field(default_factory=lambda: TlsPlan())
    #: Single sign-on through an OpenID Connect provider (``control.sso``); None: not configured.
    sso: sso_config.SsoConfig | None = None
    #: Scheduled backups (``--backup-dir``…; ``control.backup.schedule``); None: none.
    backup: backup_schedule.Schedule | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class TlsPlan:
    """How ``llmgw server``'s HTTP port is served, as :func:`tls_plan` decided it from the flags."""

    #: HTTPS on the HTTP port (OpenAI API, REST, UI, mirror).
    on: bool = False
    #: The operator's certificate and key files (``--tls-cert/--tls-key``); None: one from the cluster CA.
    cert: Path | None = None
    key: Path | None = None
    #: More names for the cluster-CA certificate (``--tls-san``).
    sans: tuple[str, ...] = ()
    #: The cluster-CA certificate's validity (``--tls-cert-validity``); issued again at two thirds.
    validity_s: float = 90 * 86400.0
    #: Plain HTTP beyond loopback on purpose (``--plain-http``): warned at start, every answer marked.
    marked_plain: bool = False
    #: The start's WARNING, when there is one.
    warning: str = ""

    @property
    def scheme(self) -> str:
        return "https" if self.on else "http"

    @property
    def cluster_ca(self) -> bool:
        """HTTPS with a certificate the server issues itself from the cluster CA."""
        return self.on and self.cert is None


@dataclasses.dataclass(frozen=True, slots=True)
class MirrorConfig:
    """``llmgw server --mirror-dir``: the mirror mounted in the server, so a cluster needs one flag."""

    dir: Path
    #: Pull missing files through from this HF-compatible endpoint ("": serve only what ``dir`` holds).
    upstream: str = ""
    #: The mirror's admin API (POST /admin/add) needs this bearer token ("": the admin API is off).
    admin_token: str = dataclasses.field(default="", repr=False)
    #: No --hub-endpoint was given: hf:// sources come from this mirror.
    serves_hub: bool = True
    #: No --mirror-url was given: mirror:// sources come from this mirror.
    serves_files: bool = True


#: The variable the hub's token is read from when no --hub-token-file is given.
HUB_TOKEN_ENV = "LLMGW_HF_TOKEN"


def hub_settings(*, endpoint: str, mirror_url: str, token_file: Path | None, env: Mapping[str, str],
                 quiet: bool = False) -> decide.Hub:
    """The hub settings from the flags, the token from its file or ``LLMGW_HF_TOKEN``; LlmgwError saying what to fix.

    The token is never a flag: an argv is readable by every user of the
    machine (``ps``, /proc) and lands in shell histories and unit files.
    """
    for flag, url in (("--hub-endpoint", endpoint), ("--mirror-url", mirror_url)):
        if url and not url.startswith(("http://", "https://")):
            raise LlmgwError(f"{flag} {url!r}: expected an http:// or https:// URL")
    token = ""
    if token_file is not None:
        try:
            token = token_file.read_text().strip()
        except OSError as e:
            raise LlmgwError(f"cannot read --hub-token-file {token_file}: {e.strerror or e}") from None
        if not token:
            raise LlmgwError(f"--hub-token-file {token_file} is empty; put the hub's token in it, or leave the "
                             "flag out to fetch without one")
    else:
        token = env.get(HUB_TOKEN_ENV, "").strip()
    hub = decide.Hub(endpoint=endpoint.rstrip("/") or decide.DEFAULT_HUB_ENDPOINT, mirror_url=mirror_url.rstrip("/"),
                     token=token)
    if not quiet:   # quiet: a mounted mirror may stand in for both URLs, and its own line says which
        log.info("remote weights: hf:// from %s%s, mirror:// from %s", hub.endpoint,
                 " with a token" if token else " without a token", hub.mirror_url or "nowhere (no --mirror-url)")
    return hub


def lease_timing(*, lease: float, renew: float) -> leader_mod.Timing:
    """The lease's timings from ``--lease`` and ``--lease-renew``: the leader stops acting a quarter of the
    lease before it could expire anywhere. LlmgwError when a renewal could not come twice in that time."""
    timing = leader_mod.Timing(lease_s=lease, renew_s=renew, margin_s=lease / 4)
    timing.check()
    return timing

def config_of(settings: ServerSettings, env: Mapping[str, str], *, default_data_dir: Path) -> ServerConfig:
    """What ``llmgw server`` starts from: the hub's token read, the lease checked; LlmgwError saying what to fix."""
    try:
        lease = lease_timing(lease=settings.lease_s, renew=settings.lease_renew_s)
    except LlmgwError as e:
        raise LlmgwError(f"--lease/--lease-renew: {e}") from None
    hub = hub_settings(endpoint=settings.hub_endpoint, mirror_url=settings.mirror_url,
                       token_file=settings.hub_token_file, env=env, quiet=settings.mirror_dir is not None)
    mirror = None if settings.mirror_dir is None else MirrorConfig(
        dir=settings.mirror_dir, upstream=settings.mirror_upstream,
        admin_token=env.get(mirror_settings.TOKEN_ENV, "").strip(), serves_hub=not settings.hub_endpoint,
        serves_files=not settings.mirror_url)
    return ServerConfig(hub=hub, mirror=mirror, host=settings.host, http_port=settings.http_port,
                        agent_port=settings.agent_port, data_dir=settings.data_dir or default_data_dir,
                        ports_file=settings.ports_file, node_grace_s=settings.node_grace,
                        unhealthy_grace_s=settings.unhealthy_grace,
                        weights_gc_free_below_pct=settings.weights_gc_free_below, insecure=settings.insecure,
                        sleep_overcommit=settings.sleep_overcommit,
                        join_port=settings.join_port, tunnel_port=settings.tunnel_port,
                        node_cert_validity_s=settings.node_cert_validity_s,
                        audit_retention_s=settings.audit_retention_s, engine_index=settings.engine_index,
                        engine_find_links=settings.engine_find_links, model_installs=settings.model_installs,
                        engine_os_packages=settings.engine_os_packages, database=settings.database,
                        advertise=settings.advertise_address, sso_redirect_url=settings.sso_redirect_url,
                        lease=lease,
                        fetch_allow_private=settings.fetch_allow_private, router=settings.router,
                        catalog=catalog_entries.load(settings.catalog) if settings.catalog is not None else None,
                        router_processes=settings.router_worker_count, usage=usage_config(settings),
                        files=FilesConfig(max_file_bytes=settings.files_max_bytes,
                                          max_files_per_project=settings.files_max_per_project,
                                          max_bytes_per_project=settings.files_max_bytes_per_project),
                        tls=tls_plan(host=settings.host, tls=settings.tls, plain_http=settings.plain_http,
                                     tls_cert=settings.tls_cert, tls_key=settings.tls_key, tls_san=settings.tls_san,
                                     insecure=settings.insecure, validity_s=settings.tls_cert_validity_s),
                        sso=sso_of(settings),
                        backup=backup_of(settings, settings.data_dir or default_data_dir))


def backup_of(settings: ServerSettings, data_dir: Path) -> backup_schedule.Schedule | None:
    """Scheduled backups from the ``--backup-*`` flags, the passphrase read from its file (its owner's alone)."""
    if settings.backup_dir is None or settings.backup_passphrase_file is None:
        return None
    if settings.backup_dir.absolute().is_relative_to(data_dir.absolute()):
        raise LlmgwError(f"--backup-dir {settings.backup_dir} is inside the data directory {data_dir}: a backup "
                         "there is lost with it; give a directory elsewhere (another disk or machine is best)")
    passphrase = sealed.read_passphrase_file(settings.backup_passphrase_file, "--backup-passphrase-file")
    return backup_schedule.Schedule(dir=settings.backup_dir, every_s=settings.backup_every_s,
                                    keep=settings.backup_keep, passphrase=passphrase)


def sso_of(settings: ServerSettings) -> sso_config.SsoConfig | None:
    """Single sign-on's configuration from the ``--sso-*`` flags (the secret read from its file, which must be
    its owner's alone); None without ``--sso-issuer``. LlmgwError naming the flag."""
    if not settings.sso_issuer or settings.sso_client_secret_file is None:
        return None
    mapping = sso_config.mapping_of(settings.sso_role_map, settings.sso_project_map, settings.sso_mapping_file)
    if not mapping.roles and not mapping.projects:
        log.warning("single sign-on has no group mapping (--sso-role-map, --sso-project-map, --sso-mapping-file): "
                    "every sign-in will be refused until a group maps to a role or project")
    return sso_config.SsoConfig(
        issuer=settings.sso_issuer.rstrip("/"), client_id=settings.sso_client_id,
        client_secret=sso_config.read_secret(settings.sso_client_secret_file),
        scopes=tuple(settings.sso_scopes.split()), groups_claim=settings.sso_groups_claim,
        username_claim=settings.sso_username_claim, mapping=mapping,
        refresh_interval_s=settings.sso_refresh_interval_s)


#: Every REST answer of an ``--insecure`` server carries this header; the CLI warns on seeing it.
INSECURE_HEADER = "X-Llmgw-Insecure"


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name other than localhost (or a wildcard): it may be reached from elsewhere


#: One label of a host name (RFC 1123; the underscore some internal DNS zones use is let through).
_LABEL = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")


def check_advertise(host: str) -> None:
    """Refuses an ``--advertise-address`` no other machine could use, with a sentence saying what to give instead.

    Checked at start: the address is only used when an agent is sent to it or a standby forwards to it, and
    without the check ``http://h`` given here became the forward address ``http://[http://h]:8080`` (its colon
    taken for an IPv6 address's), found only when a standby first failed to reach it.
    """
    if not host:
        return
    said = f"--advertise-address {host!r}"
    want = "give the host name or IP address other machines reach this server by, e.g. ctl.example.com or 10.0.0.5"
    if "://" in host:
        raise LlmgwError(f"{said}: a URL; {want} (no scheme: the ports come from --http-port and --agent-port)")
    try:
        ip = ipaddress.ip_address(host[1:-1] if host.startswith("[") and host.endswith("]") else host)
    except ValueError:
        ip = None
    if ip is not None:
        if ip.is_unspecified:
            raise LlmgwError(f"{said}: a wildcard is where a server listens, not an address anyone can reach; {want}")
        return
    if ":" in host:
        raise LlmgwError(f"{said}: not a host (a port is not part of it: the ports come from --http-port and "
                         f"--agent-port); {want}")
    name = host[:-1] if host.endswith(".") else host
    if len(name) > 253 or not all(_LABEL.fullmatch(label) for label in name.split(".")):
        raise LlmgwError(f"{said}: not a host name (letters, digits and hyphens, in dot-separated labels of at "
                         f"most 63); {want}")


def tls_plan(*, host: str, tls: bool = False, plain_http: bool = False, tls_cert: Path | None = None,
             tls_key: Path | None = None, tls_san: tuple[str, ...] = (), insecure: bool = False,
             validity_s: float = TlsPlan.validity_s) -> TlsPlan:
    """Whether the HTTP port speaks TLS, and with which certificate; LlmgwError, naming the flag, when contradictory.

    Beyond loopback (a wildcard, a name, an address other than 127/8 and ::1): HTTPS, unless ``--plain-http``
    says a TLS-terminating proxy is in front (then warned, and every answer marked). On loopback (``make up``,
    tests): plain, unless ``--tls``, ``--tls-cert`` or ``--tls-san`` asks for HTTPS. ``--insecure`` (loopback
    only; no cluster CA is made in that mode) may take the operator's ``--tls-cert/--tls-key``, not a cluster-CA
    certificate.
    """
    if (tls_cert is None) != (tls_key is None):
        given, missing = ("--tls-cert", "--tls-key") if tls_cert is not None else ("--tls-key", "--tls-cert")
        raise LlmgwError(f"{given} needs {missing}: give the certificate and its key together, or neither (the "
                         "server then uses a certificate from the cluster CA)")
    asked = [flag for flag, given in (("--tls", tls), ("--tls-cert", tls_cert is not None),
                                      ("--tls-san", bool(tls_san))) if given]
    if plain_http and asked:
        raise LlmgwError(f"--plain-http and {asked[0]} contradict each other: leave --plain-http out to serve HTTPS, "
                         f"or leave {asked[0]} out to serve plain HTTP behind a TLS-terminating proxy")
    if tls_cert is not None and tls_san:
        raise LlmgwError("--tls-san names the cluster-CA certificate's hosts; with --tls-cert the names are your "
                         "certificate's own: leave --tls-san out")
    if insecure and asked and tls_cert is None:
        raise LlmgwError(f"--insecure and {asked[0]}: an --insecure server makes no cluster CA to issue the HTTP "
                         "port's certificate from; give your own --tls-cert/--tls-key, or leave --insecure out")
    if _is_loopback(host):
        return TlsPlan(on=bool(asked), cert=tls_cert, key=tls_key, sans=tls_san, validity_s=validity_s)
    if plain_http:
        return TlsPlan(marked_plain=True, warning=(
            f"PLAIN HTTP: --plain-http on --host {host}: logins, tokens and prompts cross the network readable unless "
            "a TLS-terminating proxy is in front of this port; every answer says so "
            f"({PLAIN_HTTP_HEADER}: 1). Leave --plain-http out to serve HTTPS here"))
    return TlsPlan(on=True, cert=tls_cert, key=tls_key, sans=tls_san, validity_s=validity_s)


#: Every answer of a server serving plain HTTP beyond loopback (``--plain-http``) carries this header.
PLAIN_HTTP_HEADER = "X-Llmgw-Plain-Http"


def check_mode(cfg: ServerConfig) -> None:
    """Refuses ``--insecure`` off loopback; warns loudly on it. LlmgwError says what to do instead."""
    if not cfg.insecure:
        return
    if not _is_loopback(cfg.host):
        raise LlmgwError(f"--insecure is for loopback development only: on --host {cfg.host} anyone who reaches it "
                         "could change the cluster, read every engine's key and join as any node. Leave "
                         "--insecure out (the REST API then needs a login and agents join with a token), or listen "
                         "on 127.0.0.1")
    log.warning("INSECURE: --insecure turns authentication off: the REST API answers anyone on this machine as an "
                "administrator and the agent stream is plaintext with any node id. For loopback development only; "
                "every REST answer says so (%s: 1)", INSECURE_HEADER)
