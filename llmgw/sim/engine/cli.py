"""The sim engine as a process: its flags, and serving until SIGTERM or SIGINT.

``python -m llmgw.sim.engine`` (and ``python -m llmgw_sim_engine``, the same code installed as a wheel) runs
``main``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import ssl
import sys

from aiohttp import web

from .app import Config, SimEngine
from .sleep import SleepConfig

#: The first line of ``--help``.
DESCRIPTION = "The sim engine: an OpenAI-compatible fake engine with a simple latency model."


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m llmgw.sim.engine", description=DESCRIPTION,
                                     allow_abbrev=False)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--model", required=True, help="the served model name")
    # The agent passes the key by environment: a command line is readable by every user of the node.
    parser.add_argument("--api-key", default=os.environ.get("LLMGW_SIM_API_KEY", ""),
                        help="require Authorization: Bearer KEY on /v1/* (default $LLMGW_SIM_API_KEY)")
    parser.add_argument("--prefill-tps", type=float, default=5000.0, help="prompt tokens per second")
    parser.add_argument("--decode-tps", type=float, default=200.0, help="generated tokens per second")
    parser.add_argument("--parallel", type=int, default=8, help="requests generating at once")
    parser.add_argument("--startup-delay", type=float, default=0.0, help="seconds /health answers 503")
    parser.add_argument("--max-tokens-default", type=int, default=16, help="max_tokens when not given")
    parser.add_argument("--echo", action="store_true",
                        help="answer a chat with its last user message, a word a token (not ' tok0 tok1 …')")
    parser.add_argument("--nnodes", type=int, default=1, help="ranks of its multi-node replica")
    parser.add_argument("--rank", type=int, default=0, help="its rank; only rank 0 serves /v1")
    parser.add_argument("--leader-addr", default="", help="rank 0's address")
    parser.add_argument("--leader-port", type=int, default=0, help="rank 0's rendezvous port")
    parser.add_argument("--kv-events-config", default="",
                        help="vLLM's flag: JSON {enable_kv_cache_events, endpoint, replay_endpoint, topic}")
    parser.add_argument("--kv-cache-blocks", type=int, default=4096, help="simulated KV cache capacity in blocks")
    parser.add_argument("--block-size", type=int, default=16, help="KV cache block size in tokens")
    # As vLLM's: serve TLS with this key and certificate (the agent's engine_tls gives the node's engine ones).
    # vLLM's LoRA flags (``sim.engine.lora``): --enable-lora turns adapters on; --max-cpu-loras (else
    # --max-loras) bounds the adapters held, least recently used evicted, as vLLM's worker does.
    parser.add_argument("--enable-lora", action="store_true", help="serve LoRA adapters loaded at runtime")
    parser.add_argument("--max-lora-rank", type=int, default=16, help="accepted as vLLM's, not enforced")
    parser.add_argument("--max-loras", type=int, default=1, help="as vLLM's: adapters in one batch (not enforced); "
                                                                  "the cache's size when --max-cpu-loras is not given")
    parser.add_argument("--max-cpu-loras", type=int, default=0, help="as vLLM's: adapters held at once, least "
                                                                      "recently used evicted")
    parser.add_argument("--lora-load-delay", type=float, default=0.0,
                        help="sim only: seconds loading an adapter not held takes")
    parser.add_argument("--ssl-keyfile", default="", help="serve HTTPS with this PEM key (with --ssl-certfile)")
    parser.add_argument("--ssl-certfile", default="", help="the PEM certificate for --ssl-keyfile")
    # As vLLM's --enable-sleep-mode (its routes also need VLLM_SERVER_DEV_MODE=1): sleep.py.
    parser.add_argument("--enable-sleep-mode", action="store_true", help="serve vLLM's /sleep, /wake_up, "
                        "/is_sleeping (with VLLM_SERVER_DEV_MODE=1, as vLLM)")
    parser.add_argument("--wake-delay", type=float, default=0.3, help="seconds a wake from level 1 takes")
    parser.add_argument("--sleep-delay", type=float, default=0.1, help="seconds going to sleep takes")
    parser.add_argument("--level2-extra-delay", type=float, default=1.0,
                        help="seconds a wake from level 2 takes beyond --wake-delay (the weights reloaded)")
    parser.add_argument("--memory-mib", type=int, default=0, help="accelerator memory it reports awake")
    parser.add_argument("--sleep-memory-mib", type=int, default=0, help="accelerator memory it reports asleep")
    args = parser.parse_args(argv)
    if min(args.wake_delay, args.sleep_delay, args.level2_extra_delay, args.memory_mib, args.sleep_memory_mib) < 0:
        parser.error("--wake-delay, --sleep-delay, --level2-extra-delay, --memory-mib and --sleep-memory-mib "
                     "must be >= 0")
    if bool(args.ssl_keyfile) != bool(args.ssl_certfile):
        parser.error("--ssl-keyfile and --ssl-certfile go together: give both, or neither for plain HTTP")
    if args.prefill_tps <= 0 or args.decode_tps <= 0 or args.parallel < 1:
        parser.error("--prefill-tps and --decode-tps must be > 0 and --parallel >= 1")
    if args.nnodes < 1 or not 0 <= args.rank < args.nnodes:
        parser.error(f"--rank must be one of 0..{max(args.nnodes, 1) - 1} and --nnodes at least 1")
    return args


def server_context(keyfile: str, certfile: str) -> ssl.SSLContext | None:
    """The TLS context of ``--ssl-keyfile/--ssl-certfile``; None for plain HTTP."""
    if not keyfile:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(certfile, keyfile)
    return ctx


async def serve(config: Config, *, host: str, port: int, tls: ssl.SSLContext | None = None) -> int:
    """Serve until SIGTERM or SIGINT; the exit status (1 when the port cannot be bound)."""
    engine = SimEngine(config)
    publisher = None
    if kv_events_on(config.kv_events_config):
        try:  # llmgw.core and pyzmq: in an llmgw install, not in the sim's own wheel
            from .kvcache import SimKvCache
            from .kvpublish import KvPublisher
        except ImportError as e:
            print(f"llmgw sim engine: --kv-events-config needs llmgw and pyzmq ({e}); run the sim as "
                  "`python -m llmgw.sim.engine` from an llmgw install, or drop --kv-events-config", file=sys.stderr)
            return 1
        cfg = json.loads(config.kv_events_config)
        publisher = KvPublisher(cfg.get("endpoint", "tcp://*:5557"), cfg.get("replay_endpoint"),
                                topic=cfg.get("topic", ""), buffer_steps=int(cfg.get("buffer_steps", 10_000)))
        publisher.start()
        engine.kv = SimKvCache(publisher, capacity_blocks=config.kv_cache_blocks, block_size=config.block_size)
    # shutdown_timeout: aiohttp waits 60 s for open requests by default, and waits it twice
    # (for the handler to end, then for it to end once cancelled); a stopped engine must be gone
    # in well under a second, and its open streams are cut anyway. 0.1 gives ~0.25 s in all.
    runner = web.AppRunner(engine.app(), handler_cancellation=True, shutdown_timeout=0.1, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, ssl_context=tls)
        try:
            await site.start()
        except OSError as e:
            print(f"llmgw sim engine: cannot listen on {host}:{port}: {e.strerror or e}; "
                  "pick another --port or stop what holds it", file=sys.stderr)
            return 1
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        bound = runner.addresses[0]
        print(f"llmgw sim engine: listening on {'https' if tls else 'http'}://{bound[0]}:{bound[1]} serving "
              f"{config.model!r}",
              flush=True)
        await stop.wait()
    finally:
        await runner.cleanup()
        if publisher is not None:
            await publisher.close()
    return 0


def kv_events_on(config_json: str) -> bool:
    """Whether vLLM's ``--kv-events-config`` JSON asks for a ZMQ publisher (as ``EventPublisherFactory.create``)."""
    if not config_json:
        return False
    cfg = json.loads(config_json)
    return bool(cfg.get("enable_kv_cache_events")) and cfg.get("publisher", "zmq") == "zmq"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    config = Config(model=args.model, api_key=args.api_key, prefill_tps=args.prefill_tps,
                    decode_tps=args.decode_tps, parallel=args.parallel, startup_delay=args.startup_delay,
                    max_tokens_default=args.max_tokens_default, echo=args.echo, nnodes=args.nnodes,
                    rank=args.rank, leader_addr=args.leader_addr, leader_port=args.leader_port,
                    kv_events_config=args.kv_events_config, kv_cache_blocks=args.kv_cache_blocks,
                    block_size=args.block_size, enable_lora=args.enable_lora,
                    max_cpu_loras=args.max_cpu_loras or args.max_loras, lora_load_delay=args.lora_load_delay,
                    sleep=SleepConfig(enabled=args.enable_sleep_mode, wake_delay=args.wake_delay,
                                      sleep_delay=args.sleep_delay, level2_extra_delay=args.level2_extra_delay,
                                      memory_mib=args.memory_mib, sleep_memory_mib=args.sleep_memory_mib))
    try:
        tls = server_context(args.ssl_keyfile, args.ssl_certfile)
    except (OSError, ssl.SSLError) as e:
        print(f"llmgw sim engine: cannot load --ssl-keyfile/--ssl-certfile: {e}", file=sys.stderr)
        return 1
    return asyncio.run(serve(config, host=args.host, port=args.port, tls=tls))
