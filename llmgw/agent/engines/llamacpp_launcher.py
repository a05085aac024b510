"""Run llama.cpp's server from the xllamacpp wheel, taking llama-server's flags.

``python -m llmgw.agent.engines.llamacpp_launcher --model M.gguf --port P ...``
stands in for a ``llama-server`` binary on machines that have none: the wheel
carries llama.cpp's own C++ server, so the HTTP surface (/health, /v1/models,
chat and completions with SSE, /metrics, /slots) is the real one. Only the
subset of flags the llamacpp adapter and model files use is accepted; any
other flag is refused by name rather than ignored.

Facts about xllamacpp this is built on (2026.10):

* ``xllamacpp.Server(params)`` binds, loads the model and returns; the server
  then runs on native threads. Deleting the object stops it ("waiting for main
  loop exit") in milliseconds.
* ``Server()`` holds the GIL while it loads, so no Python signal handler can
  run until it returns. SIGTERM and SIGINT keep their default action (end the
  process) until then: a stop during a long load ends it at once instead of
  waiting for the load.
* A missing model and a busy port raise the same ``RuntimeError("Failed to init
  server")`` and say which only on stderr, so both are checked first here and
  refused with a one-line reason and exit status 1.
* The API key is ``params.api_keys`` (a list); the alias is ``params.model_alias``
  (a set). Without ``kv_unified`` each slot gets only n_ctx / n_parallel of
  context, so it is on unless ``--no-kv-unified`` is given, as in llama-server.
* ``-b/--batch-size``, ``-ub/--ubatch-size``, ``--cache-ram`` and
  ``--[no-]cache-idle-slots`` set the llama.cpp parameters of those names
  (``n_batch``, ``n_ubatch``, ``cache_ram_mib``, ``cache_idle_slots``); unset, the
  library's defaults stay (2048, 512, 8192 MiB, on).
* ``--embeddings`` (``params.embedding``) with ``--pooling mean`` (``params.pooling_type``)
  serves ``/v1/embeddings`` and still serves chat and completions, the same text
  token for token: checked on SmolLM2-135M. (llama.cpp documents the flag as
  restricting the server to embeddings, and some builds of mid-2024 refused
  completions with it, ggml-org/llama.cpp#3815; this one does not.) Without a
  pooling a model that has none in its GGUF (a chat model) answers 400 "Pooling
  type 'none' is not OAI compatible". An input must fit one physical batch
  (``--ubatch-size``, at most ``--batch-size``), or llama.cpp answers 500 "input
  (N tokens) is too large to process".
* ``--lora FILE`` (repeatable) loads a GGUF LoRA adapter, ``params.lora_adapters`` (a list of
  ``CommonAdapterLoraInfo(path, scale)``), numbered from 0 in the order given; a request picks some with
  llama.cpp's ``"lora": [{"id": 0, "scale": 1.0}]`` (the others then run at scale 0), and ``GET
  /lora-adapters`` lists them. ``params.lora_init_without_apply`` alone does not keep them off a request
  that names none (measured: such a request ran every adapter at its scale 1.0, and ``"lora": []`` too), so
  ``--lora-init-without-apply`` loads each at scale 0, which is what the flag means. And a slot's cached
  prompt is reused across requests with different adapters (the same request answered differently after
  another adapter's), so the router turns the prompt cache off for such a model's requests
  (``router/loraroute.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import os
import select
import signal
import socket
import sys
from typing import Any

try:  # run as a module of llmgw
    from llmgw.agent.engines import tlsrelay
except ImportError:  # run by its file path (an install's python without llmgw): its directory is on sys.path
    import tlsrelay  # type: ignore[no-redef]

PROG = "llamacpp_launcher"
#: ``--pooling`` values, as llama-server takes them; each is ``llama_pooling_type.LLAMA_POOLING_TYPE_<NAME>``.
POOLINGS = ("none", "mean", "cls", "last", "rank")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=f"python -m llmgw.agent.engines.{PROG}", allow_abbrev=False,
                                     description="llama.cpp's server from the xllamacpp wheel")
    parser.add_argument("-m", "--model", required=True, help="path to a .gguf file")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080, help="0 picks a free port")
    parser.add_argument("-a", "--alias", default="", help="the model name served (default: file name)")
    parser.add_argument("--api-key", default=os.environ.get("LLAMA_API_KEY", ""),
                        help="require Authorization: Bearer KEY (default $LLAMA_API_KEY, as llama-server)")
    parser.add_argument("-t", "--threads", type=int, default=-1, help="-1: llama.cpp decides")
    parser.add_argument("-c", "--ctx-size", type=int, default=0, help="0: the model's training context")
    parser.add_argument("-np", "--parallel", type=int, default=4, help="slots (requests at once)")
    parser.add_argument("--kv-unified", action=argparse.BooleanOptionalAction, default=True,
                        help="one KV cache shared by all slots (default on)")
    parser.add_argument("-sps", "--slot-prompt-similarity", type=float, default=None,
                        help="how alike a prompt must be to a slot's cached one for that slot to take it "
                             "(llama.cpp's default 0.1; 0 takes the least recently used slot)")
    parser.add_argument("-b", "--batch-size", type=int, default=None,
                        help="prompt tokens per decode call (llama.cpp's default 2048); a request whose "
                             "client left is stopped only between two, so smaller ones stop sooner")
    parser.add_argument("-ub", "--ubatch-size", type=int, default=None,
                        help="physical batch (llama.cpp's default 512); at most --batch-size")
    parser.add_argument("--cache-idle-slots", action=argparse.BooleanOptionalAction, default=None,
                        help="move an idle slot's prompt into the RAM prompt cache whenever a task starts "
                             "(llama.cpp's default on)")
    parser.add_argument("-cram", "--cache-ram", type=int, default=None,
                        help="MiB of RAM for the prompt cache (llama.cpp's default 8192; 0 off, -1 no limit)")
    parser.add_argument("--metrics", action="store_true", help="serve /metrics")
    parser.add_argument("--embedding", "--embeddings", dest="embeddings", action="store_true",
                        help="serve /v1/embeddings too (chat and completions stay served)")
    parser.add_argument("--pooling", choices=POOLINGS, default=None,
                        help="how a text's token vectors become one (default: the model's own; a chat "
                             "model has none, so give mean)")
    parser.add_argument("-ngl", "--n-gpu-layers", "--gpu-layers", default=None,
                        help="layers on the GPU: a number, 'auto' or 'all'")
    parser.add_argument("--lora", action="append", default=[], metavar="FILE",
                        help="a GGUF LoRA adapter (repeatable; numbered from 0 in this order)")
    parser.add_argument("--lora-init-without-apply", action="store_true",
                        help="load the adapters at scale 0: only a request's own 'lora' field applies one")
    parser.add_argument("--ssl-key-file", default="", help="serve HTTPS with this PEM key (with --ssl-cert-file)")
    parser.add_argument("--ssl-cert-file", default="", help="the PEM certificate for --ssl-key-file")
    args = parser.parse_args(argv)
    if bool(args.ssl_key_file) != bool(args.ssl_cert_file):
        parser.error("--ssl-key-file and --ssl-cert-file go together: give both, or neither for plain HTTP")
    if args.parallel < 1:
        parser.error(f"--parallel must be at least 1, not {args.parallel}")
    if args.slot_prompt_similarity is not None and not 0.0 <= args.slot_prompt_similarity <= 1.0:
        parser.error(f"--slot-prompt-similarity must be between 0 and 1, not {args.slot_prompt_similarity}")
    if args.cache_ram is not None and args.cache_ram < -1:
        parser.error(f"--cache-ram takes MiB, 0 (off) or -1 (no limit), not {args.cache_ram}")
    for flag, value in (("--batch-size", args.batch_size), ("--ubatch-size", args.ubatch_size)):
        if value is not None and value < 1:
            parser.error(f"{flag} must be at least 1, not {value}")
    if args.batch_size is not None and args.ubatch_size is None:
        args.ubatch_size = min(args.batch_size, 512)  # llama.cpp refuses a ubatch over the batch
    if args.batch_size is not None and args.ubatch_size is not None and args.ubatch_size > args.batch_size:
        parser.error(f"--ubatch-size {args.ubatch_size} is over --batch-size {args.batch_size}; "
                     "make it at most that")
    return args


def check_model(path: str, what: str = "model") -> str | None:
    """Why ``path`` cannot be loaded as a GGUF model (or LoRA adapter), or None when it looks loadable."""
    if not os.path.exists(path):
        return f"{what} file {path} does not exist"
    if not os.path.isfile(path):
        return f"{what} path {path} is not a file"
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        return f"{what} file {path} cannot be read: {e.strerror or e}"
    if magic != b"GGUF":
        return f"{what} file {path} is not a GGUF file (it starts with {magic!r}, not b'GGUF')"
    return None


def check_port(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be listened on, or None when a bind just succeeded there."""
    if port == 0:
        return None
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        return f"host {host!r} does not resolve: {e}"
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        # As llama.cpp's listener does: without it a port in TIME_WAIT from the last run would be
        # reported busy although the server could bind it.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as e:
            return (f"port {port} on {host} is not available ({e.strerror or e}); pick another --port "
                    "or stop what holds it")
    return None


def gpu_layers(value: str | None, xllamacpp: Any) -> int | None:
    """The n_gpu_layers to set, None to leave llama.cpp's default; warns when no GPU will use it."""
    if value is None:
        return None
    layers = {"auto": -1, "all": 999}.get(value)
    if layers is None:
        try:
            layers = int(value)
        except ValueError:
            raise SystemExit(f"{PROG}: --n-gpu-layers takes a number, 'auto' or 'all', not {value!r}") from None
    devices = xllamacpp.get_device_info()
    if layers != 0 and all(d["type"] == xllamacpp.ggml_backend_dev_type.GGML_BACKEND_DEVICE_TYPE_CPU
                           for d in devices):
        print(f"{PROG}: warning: --n-gpu-layers {value} ignored: this llama.cpp build sees no GPU",
              file=sys.stderr, flush=True)
    return layers


def build_params(args: argparse.Namespace, xllamacpp: Any) -> Any:
    params = xllamacpp.CommonParams()
    params.model.path = args.model
    params.hostnames = [args.host]
    params.port = args.port
    params.n_ctx = args.ctx_size
    params.n_parallel = args.parallel
    params.kv_unified = args.kv_unified
    if args.slot_prompt_similarity is not None:
        params.slot_prompt_similarity = args.slot_prompt_similarity
    params.cpuparams.n_threads = args.threads
    if args.cache_idle_slots is not None:
        params.cache_idle_slots = args.cache_idle_slots
    if args.cache_ram is not None:
        params.cache_ram_mib = args.cache_ram
    if args.batch_size is not None:
        params.n_batch = args.batch_size
    if args.ubatch_size is not None:
        params.n_ubatch = args.ubatch_size
    params.endpoint_metrics = args.metrics
    params.embedding = args.embeddings
    if args.pooling is not None:
        params.pooling_type = getattr(xllamacpp.llama_pooling_type, f"LLAMA_POOLING_TYPE_{args.pooling.upper()}")
    if args.alias:
        params.model_alias = {args.alias}
    if args.api_key:
        params.api_keys = [args.api_key]
    layers = gpu_layers(args.n_gpu_layers, xllamacpp)
    if layers is not None:
        params.n_gpu_layers = layers
    if args.lora:
        scale = 0.0 if args.lora_init_without_apply else 1.0
        params.lora_adapters = [xllamacpp.CommonAdapterLoraInfo(path, scale) for path in args.lora]
    return params


def inner_address(listening: str) -> tuple[str, int]:
    """(host, port) of llama.cpp's ``listening_address`` ("http://127.0.0.1:PORT" or "127.0.0.1:PORT")."""
    rest = listening.split("://", 1)[-1].rstrip("/")
    host, _, port = rest.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


def wait_for_stop() -> int:
    """Block until SIGTERM or SIGINT arrives (on any thread) and return its number."""
    # llama.cpp's native threads do not block these signals, so one may be delivered to any of
    # them; a Python handler then runs only when the main thread next runs bytecode. The wakeup
    # fd is written by the C-level handler whichever thread took the signal, so select wakes.
    reader, writer = socket.socketpair()
    reader.setblocking(False)
    writer.setblocking(False)
    signal.set_wakeup_fd(writer.fileno())
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    while True:
        select.select([reader], [], [])
        with contextlib.suppress(BlockingIOError):
            data = reader.recv(64)
            for number in data:
                if number in (signal.SIGTERM, signal.SIGINT):
                    return number


def main(argv: list[str] | None = None) -> int:
    # Until the server is up, a stop ends the process at once (see the module docstring).
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    args = parse_args(argv)
    problem = (check_model(args.model) or next(filter(None, (check_model(p, "LoRA adapter") for p in args.lora)), None)
               or check_port(args.host, args.port))
    if problem:
        print(f"{PROG}: {problem}", file=sys.stderr, flush=True)
        return 1
    try:
        import xllamacpp
    except ImportError:
        print(f"{PROG}: the xllamacpp wheel is not installed; pip install 'llmgw[llamacpp]' "
              "or put a llama-server binary on PATH", file=sys.stderr, flush=True)
        return 1
    relay_ctx = None
    if args.ssl_key_file:
        # The wheels are built without SSL (tlsrelay says how that was found): llama.cpp serves a loopback
        # port of its own choosing, and the relay serves TLS on the address and port asked for.
        try:
            relay_ctx = tlsrelay.server_context(args.ssl_key_file, args.ssl_cert_file)
        except (OSError, ValueError) as e:
            print(f"{PROG}: cannot load --ssl-key-file/--ssl-cert-file: {e}", file=sys.stderr, flush=True)
            return 1
    params = build_params(args, xllamacpp)
    if relay_ctx is not None:
        params.hostnames, params.port = ["127.0.0.1"], 0
    try:
        server = xllamacpp.Server(params)
    except RuntimeError as e:
        print(f"{PROG}: llama.cpp did not start ({e}); its log lines above say why", file=sys.stderr,
              flush=True)
        return 1
    version = importlib.metadata.version("xllamacpp")
    listening = str(server.listening_address)
    if relay_ctx is not None:
        try:
            host, port = tlsrelay.run_in_thread(args.host, args.port, relay_ctx, inner_address(listening))
        except OSError as e:
            print(f"{PROG}: cannot listen on {args.host}:{args.port}: {e.strerror or e}", file=sys.stderr, flush=True)
            return 1
        listening = f"https://{host}:{port} (TLS relay to llama.cpp on {listening})"
    print(f"{PROG}: listening on {listening} serving {args.alias or args.model!r} "
          f"(xllamacpp {version}, threads {args.threads}, parallel {args.parallel}"
          f"{', embeddings' if args.embeddings else ''})", flush=True)
    received = wait_for_stop()
    print(f"{PROG}: {signal.Signals(received).name} received; stopping", flush=True)
    del server  # The destructor stops llama.cpp's loop and joins its threads.
    return 0


if __name__ == "__main__":
    sys.exit(main())
