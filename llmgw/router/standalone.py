"""Running the router on its own: ``python -m llmgw.router.standalone``.

Either from a static table (``--table-file``, an endpoints document as the
control plane serves it; for tests and benchmarks) or following a control
plane (``--control URL[,URL...]``: with several, the leader and its standbys,
it follows one and moves to the next when that one stops answering). The server
is the router's own (``server``: asyncio and httptools, on uvloop when it is
installed) rather than uvicorn, whose per-request machinery cost more than the
proxying at capacity; the app's pools open before it listens and close after it
stopped. No access log: a log line per request costs more than the proxying
does. Alone, the router serves its own ``GET /metrics``.

SIGTERM or SIGINT stops listening at once, lets open requests (streams) finish
for ``--graceful-shutdown`` seconds, then cuts them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

from llmgw.router import app as app_mod
from llmgw.router import auth, limits, reports, signals, tracing, watch
from llmgw.router import server as server_mod
from llmgw.router import table as table_mod

log = logging.getLogger("llmgw.router")


#: The router's credential for the control plane when no --token-file is given.
TOKEN_ENV = "LLMGW_ROUTER_TOKEN"


def read_token(token_file: Path | None, env: dict[str, str]) -> str:
    """The router's token from ``--token-file``, else ``LLMGW_ROUTER_TOKEN``, else ""; ValueError saying what is wrong.

    Never a flag's value: an argv is readable by every user of the machine (``ps``, /proc).
    """
    if token_file is None:
        return env.get(TOKEN_ENV, "").strip()
    try:
        token = token_file.read_text().strip()
    except OSError as exc:
        raise ValueError(f"cannot read --token-file {token_file}: {exc.strerror or exc}") from None
    if not token:
        raise ValueError(f"--token-file {token_file} is empty; put the token of `llmgw router-token create NAME` in it")
    return token


def build(*, table_file: Path | None = None, control_urls: str | Sequence[str] | None = None,
          max_body_bytes: int = 32 << 20, keepalive_s: float = 15.0, host: str = "127.0.0.1", router_id: str = "",
          tracing_endpoint: str = "", admission_queue: int = 100, admission_wait_s: float = 30.0,
          token: str = "", signals_interval_s: float = 2.0) -> app_mod.RouterApp:
    """A RouterApp over a static table or one followed from a control plane, serving its own /metrics.

    Following a control plane (one URL, or several tried in turn), it reports ejections and the
    autoscaler's load signals to the one it follows as ``router_id``, and proves itself to it with
    ``token`` (a router credential), every ``signals_interval_s`` and at once when it holds a request
    for a model at zero. ``host`` is
    the listen address: keyless tables there get a warning unless it is loopback.
    """
    holder = table_mod.TableHolder()
    watcher: watch.TableWatcher | None = None
    sink: reports.Sink | None = None
    reporter: signals.Reporter | None = None
    guard = auth.ListenGuard(host)
    if table_file is not None:
        holder.swap(table_mod.RouteTable.from_doc(json.loads(table_file.read_text())))
        guard.check(holder.current.auth)
        source = str(table_file)
    elif control_urls:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        following = watch.TableWatcher(control_urls, holder, listen_guard=guard, headers=headers)
        watcher = following
        # Reports go where the table comes from: a control plane that answers now, not the
        # first one given, which may be the one that is down.
        sink = reports.HttpSink(router_id or socket.gethostname(), lambda: following.current_url, headers=headers)
        reporter = signals.Reporter(router_id or socket.gethostname(), control_url=lambda: following.current_url,
                                    headers=headers, interval_s=signals_interval_s)
        urls = [control_urls] if isinstance(control_urls, str) else list(control_urls)
        source = (f"the control plane at {urls[0]}" if len(urls) == 1
                  else f"the control planes at {', '.join(urls)}")
    else:
        raise ValueError("give a table file or a control-plane URL")
    traced = tracing.Tracing(tracing_endpoint) if tracing_endpoint else None
    # serve_metrics: alone, nothing else serves the router's metrics; its own app does.
    return app_mod.RouterApp(holder, watcher=watcher, source=source, max_body_bytes=max_body_bytes,
                             keepalive_s=keepalive_s, serve_metrics=True, events=sink, tracing=traced, signals=reporter,
                             admission_queue=admission_queue, admission_wait_s=admission_wait_s)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m llmgw.router.standalone",
                                     description="Serve the OpenAI API, forwarding to engines.",
                                     allow_abbrev=False)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--table-file", type=Path, help="a static endpoints document (JSON)")
    source.add_argument("--control", type=_control_urls, metavar="URL[,URL...]",
                        help="the control plane's base URL, e.g. http://127.0.0.1:8080; several, comma-separated "
                             "(a leader and its standbys): the router follows one, and the next when it stops "
                             "answering")
    parser.add_argument("--token-file", type=Path, default=None,
                        help="a file holding this router's credential for the control plane (`llmgw router-token "
                             f"create NAME`) [default: the {TOKEN_ENV} environment variable]")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--max-body-bytes", type=int, default=32 << 20, metavar="BYTES",
                        help="larger request bodies are refused with 413 (default 32 MiB)")
    parser.add_argument("--keepalive", type=float, default=15.0, metavar="SECONDS",
                        help="an SSE comment this often while a stream waits for its first token; 0: off")
    add_limit_flags(parser)
    parser.add_argument("--graceful-shutdown", type=float, default=30.0, metavar="SECONDS",
                        help="how long open streams may finish after SIGTERM before they are cut")
    parser.add_argument("--router-id", default="",
                        help="this router's name in the ejections and load it reports to the control plane "
                             "[default: the hostname]")
    parser.add_argument("--tracing-endpoint", default=os.environ.get("LLMGW_TRACING_ENDPOINT", ""), metavar="URL",
                        type=_tracing_endpoint,
                        help="export OpenTelemetry spans over OTLP/HTTP to this collector, e.g. "
                             "http://127.0.0.1:4318 [env LLMGW_TRACING_ENDPOINT; default: off]")
    parser.add_argument("--admission-queue", type=int, default=100, metavar="N",
                        help="requests that may wait per model when it is at its concurrency limit")
    parser.add_argument("--admission-wait", type=float, default=30.0, metavar="SECONDS",
                        help="how long one may wait for a slot before a 429 with Retry-After")
    parser.add_argument("--signals-interval", type=_positive_seconds, default=2.0, metavar="SECONDS",
                        help="how often the load the autoscaler scales on is reported to the control plane (a "
                             "request held for a model at zero is reported at once)")
    return parser.parse_args(argv)


def add_limit_flags(parser: argparse.ArgumentParser) -> None:
    """The HTTP server's limits on reading requests (``limits.Limits``), as flags."""
    parser.add_argument("--header-timeout", type=float, default=limits.HEADER_TIMEOUT_S, metavar="SECONDS",
                        help=limits.FLAG_HELP["header_timeout_s"])
    parser.add_argument("--body-timeout", type=float, default=limits.BODY_TIMEOUT_S, metavar="SECONDS",
                        help=limits.FLAG_HELP["body_timeout_s"])
    parser.add_argument("--idle-timeout", type=float, default=limits.IDLE_TIMEOUT_S, metavar="SECONDS",
                        help=limits.FLAG_HELP["idle_timeout_s"])
    parser.add_argument("--max-connections-per-address", type=int, default=limits.MAX_PER_ADDRESS, metavar="N",
                        help=limits.FLAG_HELP["max_per_address"])


def limits_of(args: argparse.Namespace) -> limits.Limits:
    """The flags' limits; ValueError naming the flag that is out of range."""
    return limits.Limits(header_timeout_s=args.header_timeout, body_timeout_s=args.body_timeout,
                         idle_timeout_s=args.idle_timeout, max_per_address=args.max_connections_per_address)


def _positive_seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if not 0 < seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {value!r}")
    return seconds


def _control_urls(value: str) -> tuple[str, ...]:
    """``URL[,URL...]``: a malformed one is a usage error naming it, not an outage logged on every poll."""
    try:
        return watch.parse_control_urls(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _tracing_endpoint(value: str) -> str:
    """The flag as given, once it reads as a collector URL: a bad one is a usage error, not a table error."""
    if value:
        try:
            tracing.traces_url(value)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        token = read_token(args.token_file, dict(os.environ)) if args.control else ""
    except ValueError as exc:
        print(f"llmgw router: {exc}", file=sys.stderr)
        return 2
    if args.control and not token:
        log.warning("no router credential (--token-file or %s): a secure control plane will refuse this router "
                    "its routes; `llmgw router-token create NAME` makes one", TOKEN_ENV)
    try:
        http_limits = limits_of(args)
    except ValueError as exc:
        print(f"llmgw router: {exc}", file=sys.stderr)
        return 2
    try:
        router = build(table_file=args.table_file, control_urls=args.control, max_body_bytes=args.max_body_bytes,
                       keepalive_s=args.keepalive, host=args.host, router_id=args.router_id,
                       tracing_endpoint=args.tracing_endpoint, admission_queue=args.admission_queue,
                       admission_wait_s=args.admission_wait, token=token,
                       signals_interval_s=args.signals_interval)
    except (OSError, ValueError, table_mod.TableError) as exc:
        print(f"llmgw router: cannot load the route table: {exc}", file=sys.stderr)
        return 2
    try:
        import uvloop
    except ImportError:  # the stock loop works, at fewer requests per second
        run = asyncio.run
    else:
        run = uvloop.run
    try:
        return run(serve(router, host=args.host, port=args.port, max_body_bytes=args.max_body_bytes,
                         grace_s=args.graceful_shutdown, http_limits=http_limits,
                         source=str(args.table_file) if args.table_file else ",".join(args.control)))
    except KeyboardInterrupt:
        return 0


async def serve(router: app_mod.RouterApp, *, host: str, port: int, max_body_bytes: int, grace_s: float,
                source: str, http_limits: limits.Limits | None = None) -> int:
    """Open the pools, listen until SIGTERM/SIGINT, drain for ``grace_s``, close the pools."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await router.startup()
    http = server_mod.Server(router, max_body_bytes=max_body_bytes, limits=http_limits or limits.Limits())
    try:
        try:
            await http.start(host, port)
        except OSError as exc:
            print(f"llmgw router: cannot listen on {host}:{port}: {exc.strerror or exc}", file=sys.stderr)
            return 2
        log.info("router on http://%s:%d, routes from %s", host, port, source)
        await stop.wait()
        log.info("stopping: no new connections; open requests have %gs to finish", grace_s)
        await http.shutdown(grace_s)
    finally:
        await router.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
