"""Running the router on its own: ``python -m llmgw.router.standalone``.

Either from a static table (``--table-file``, an endpoints document as the
control plane serves it; for tests and benchmarks) or following a control
plane (``--control URL``). The server is uvicorn with uvloop and httptools when
they are installed (``"auto"`` finds them), lifespan on so the app's pools open
and close with the process, and no access log: a log line per request costs more
than the proxying does. Alone, the router serves its own ``GET /metrics``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import uvicorn

from llmgw.router import app as app_mod
from llmgw.router import table as table_mod
from llmgw.router import watch

log = logging.getLogger("llmgw.router")


def build(*, table_file: Path | None = None, control_url: str | None = None, max_body_bytes: int = 32 << 20,
          keepalive_s: float = 15.0) -> app_mod.RouterApp:
    """A RouterApp over a static table or one followed from a control plane, serving its own /metrics."""
    holder = table_mod.TableHolder()
    watcher: watch.TableWatcher | None = None
    if table_file is not None:
        holder.swap(table_mod.RouteTable.from_doc(json.loads(table_file.read_text())))
        source = str(table_file)
    elif control_url is not None:
        watcher = watch.TableWatcher(control_url, holder)
        source = f"the control plane at {control_url}"
    else:
        raise ValueError("give a table file or a control-plane URL")
    # serve_metrics: alone, nothing else serves the router's metrics; its own app does.
    return app_mod.RouterApp(holder, watcher=watcher, source=source, max_body_bytes=max_body_bytes,
                             keepalive_s=keepalive_s, serve_metrics=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m llmgw.router.standalone",
                                     description="Serve the OpenAI API, forwarding to engines.",
                                     allow_abbrev=False)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--table-file", type=Path, help="a static endpoints document (JSON)")
    source.add_argument("--control", help="the control plane's base URL, e.g. http://127.0.0.1:8080")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--max-body-bytes", type=int, default=32 << 20, metavar="BYTES",
                        help="larger request bodies are refused with 413 (default 32 MiB)")
    parser.add_argument("--keepalive", type=float, default=15.0, metavar="SECONDS",
                        help="an SSE comment this often while a stream waits for its first token; 0: off")
    parser.add_argument("--graceful-shutdown", type=float, default=30.0, metavar="SECONDS",
                        help="how long open streams may finish after SIGTERM before they are cut")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        router = build(table_file=args.table_file, control_url=args.control, max_body_bytes=args.max_body_bytes,
                       keepalive_s=args.keepalive)
    except (OSError, ValueError, table_mod.TableError) as exc:
        print(f"llmgw router: cannot load the route table: {exc}", file=sys.stderr)
        return 2
    log.info("router on http://%s:%d, routes from %s", args.host, args.port,
             args.table_file or args.control)
    uvicorn.run(router, host=args.host, port=args.port, loop="auto", http="auto", lifespan="on",
                access_log=False, log_level=args.log_level, server_header=False,
                timeout_graceful_shutdown=args.graceful_shutdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
