"""What LoRA adapters cost the router per request (``llmgw.router.loraroute``), by the route a request takes.

Times the one step the request path adds (``proxying``: ``if route.lora is not None: loraroute.apply``) on a
real route table: a model without adapters (the test alone, the cost every other request pays), a llama.cpp
adapter's request (its ``lora`` field and the prompt cache off put in front), the same with a ``lora_scale``,
a llama.cpp base model with adapters, and a vLLM adapter's (nothing added). For scale, ``request.parse`` of
the same body. Each figure is the best of ``--repeat`` runs of ``--number`` calls: other load only adds time.

    .venv/bin/python bench/lora_route_cost.py
"""

from __future__ import annotations

import argparse
import json
import sys
import timeit
from collections.abc import Callable

from llmgw.api import routing
from llmgw.router import loraroute, request
from llmgw.router.table import ModelRoute, RouteTable

BODY = {"model": "", "messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 16}


def table(engine: str) -> RouteTable:
    ep = routing.EndpointDoc("r1", "http://127.0.0.1:1", adapters=("sql", "chat"))
    models = (routing.ModelEntry(name="base", served_name="base", endpoints=(ep,), adapters=("sql", "chat"),
                                 engine=engine),
              routing.ModelEntry(name="plain", served_name="plain", endpoints=(ep,), engine=engine))
    return RouteTable.from_doc(routing.EndpointsDoc(models=models).to_doc())


def step(route: ModelRoute, body: dict[str, object]) -> Callable[[], object]:
    raw = json.dumps({**body, "model": route.name}).encode()
    req = request.parse(raw)

    def run() -> object:
        out = raw
        if route.lora is not None:
            out = loraroute.apply(route.lora, req, out)
        return out
    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    llama, vllm = table("llamacpp"), table("vllm")

    def route(t: RouteTable, name: str) -> ModelRoute:
        found = t.lookup(name)
        assert found is not None
        return found
    raw = json.dumps({**BODY, "model": "plain"}).encode()
    cases = [("model without adapters (the test only)", step(route(llama, "plain"), BODY)),
             ("llama.cpp adapter", step(route(llama, "sql"), BODY)),
             ("llama.cpp adapter, lora_scale 0.5", step(route(llama, "sql"), {**BODY, "lora_scale": 0.5})),
             ("llama.cpp base with adapters", step(route(llama, "base"), BODY)),
             ("vLLM adapter (nothing added)", step(route(vllm, "sql"), BODY)),
             ("for scale: request.parse of the body", lambda: request.parse(raw))]
    for name, fn in cases:
        best = min(timeit.repeat(fn, number=args.number, repeat=args.repeat)) / args.number
        print(f"{name:45} {best * 1e6:7.3f} µs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
