"""A stand-in control plane for agent tests: any AgentService servicer on a loopback port, in a thread."""

from __future__ import annotations

import asyncio
import threading

import grpc

from llmgw.api.v1 import agent_pb2_grpc


def serve(servicer: agent_pb2_grpc.AgentServiceServicer, port: int, ready: threading.Event,
          stop: threading.Event) -> None:
    """Serve ``servicer`` on 127.0.0.1:``port`` (plaintext gRPC); set ``ready`` once listening, return after ``stop``.

    Meant as a thread's target, so a test's own code stays synchronous.
    """

    async def main() -> None:
        server = grpc.aio.server()
        agent_pb2_grpc.add_AgentServiceServicer_to_server(servicer, server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        ready.set()
        await asyncio.to_thread(stop.wait)
        await server.stop(0)

    asyncio.run(main())
