"""The whole system on loopback: server, agent and sim engines as processes, the real openai client."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import httpx
import openai
import psutil
import pytest

from llmgw.testing import openai_schema
from llmgw.testing.procs import wait_for
from llmgw.testing.system import LLMGW, System, sim_model


def client(system: System) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{system.url}/v1", api_key="unused", max_retries=0, timeout=30)


def test_sim_model_is_served_streaming_and_not(system: System) -> None:
    """A model applied over REST gets placed, started and served through the router, both ways."""
    system.apply(sim_model("sim-a", replicas=2))
    assert system.wait_model("sim-a")["ready_replicas"] == 2
    system.wait_router("sim-a", 2)
    c = client(system)
    chat = c.chat.completions.create(model="sim-a", messages=[{"role": "user", "content": "hello"}], max_tokens=5)
    openai_schema.validate("chat", chat.model_dump(mode="json", exclude_unset=True))
    assert chat.choices[0].message.content and chat.usage and chat.usage.completion_tokens == 5
    chunks = list(c.chat.completions.create(model="sim-a", messages=[{"role": "user", "content": "hi"}],
                                            max_tokens=4, stream=True, stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert len(text.split()) == 4 and chunks[-1].usage and chunks[-1].usage.completion_tokens == 4
    comp = c.completions.create(model="sim-a", prompt="once upon", max_tokens=3)
    assert comp.choices[0].text and comp.choices[0].finish_reason == "length"
    streamed = list(c.completions.create(model="sim-a", prompt="once upon", max_tokens=3, stream=True))
    assert "".join(s.choices[0].text for s in streamed if s.choices).split() == comp.choices[0].text.split()
    assert [m.id for m in c.models.list().data] == ["sim-a"]


def test_requests_are_spread_over_replicas(system: System) -> None:
    """Round-robin: consecutive requests land on both replicas."""
    system.apply(sim_model("sim-rr", replicas=2))
    system.wait_model("sim-rr")
    system.wait_router("sim-rr", 2)
    seen = set()
    for _ in range(6):
        r = system.request("POST", "/v1/chat/completions", json={
            "model": "sim-rr", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1})
        assert r.status_code == 200
        seen.add(r.headers["x-llmgw-upstream"])
    assert seen == {r["id"] for r in system.replicas("sim-rr")}


def test_router_errors_are_openai_shaped(system: System) -> None:
    """Unknown model 404, malformed JSON 400, nothing placeable 503 saying why; all in the error shape."""
    c = client(system)
    with pytest.raises(openai.NotFoundError) as nf:
        c.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    openai_schema.validate("error", nf.value.body if "error" in nf.value.body else {"error": nf.value.body})
    bad = system.request("POST", "/v1/chat/completions", content=b"{not json",
                         headers={"content-type": "application/json"})
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
    system.apply(sim_model("huge", resources={"memory": "100TiB"}))
    refusal = "no node has 100.0 TiB free memory"
    wait_for(lambda: refusal in system.model_status("huge")["message"], timeout=10, what="refusal")

    def routed() -> httpx.Response | None:
        # The router's table follows the store by a pass; the 503 carries the reason once it has it.
        r = system.request("POST", "/v1/chat/completions", json={
            "model": "huge", "messages": [{"role": "user", "content": "x"}]})
        return r if r.status_code == 503 and refusal in r.text else None

    err = wait_for(routed, timeout=10, what="a 503 saying why").json()["error"]
    assert "Pending" in err["message"] and refusal in err["message"], err


def test_bad_model_file_is_refused_with_field(system: System, tmp_path: os.PathLike[str]) -> None:
    """REST answers 422 naming the field; the CLI says file and field and applies nothing."""
    doc = sim_model("bad")
    doc["spec"]["replcas"] = 2
    r = system.request("POST", "/api/v1/models", json=doc)
    assert r.status_code == 422 and r.json()["error"]["param"] == "spec.replcas"
    path = os.path.join(tmp_path, "bad.yaml")
    with open(path, "w") as f:
        f.write("apiVersion: llmgw/v1\nkind: Model\nmetadata: {name: ok}\nspec: {engine: sim}\n---\n"
                "apiVersion: llmgw/v1\nkind: Model\nmetadata: {name: bad}\nspec: {engine: sim, replicas: -2}\n")
    out = subprocess.run([*LLMGW, "apply", "-f", path, "--url", system.url], capture_output=True, text=True,
                         timeout=60, env=system.cli_env())
    assert out.returncode == 1
    assert "bad.yaml (document 2): spec.replicas: must be between 0 and 1000, got -2" in out.stderr
    assert system.get("/api/v1/models")["items"] == []  # the valid first document was not applied either


def test_cli_apply_get_delete(system: System, tmp_path: os.PathLike[str]) -> None:
    """`llmgw apply`, `get -o json` and `delete model` against the running server."""
    path = os.path.join(tmp_path, "m.yaml")
    with open(path, "w") as f:
        json.dump(sim_model("cli-m"), f)  # JSON is YAML too
    run = [*LLMGW]
    out = subprocess.run([*run, "apply", "-f", path, "--url", system.url], capture_output=True, text=True,
                         timeout=60, env=system.cli_env())
    assert out.returncode == 0 and "model/cli-m created" in out.stdout
    system.wait_model("cli-m")
    got = subprocess.run([*run, "get", "replicas", "-o", "json", "--url", system.url], capture_output=True,
                         text=True, timeout=60, env=system.cli_env())
    assert [r["phase"] for r in json.loads(got.stdout)] == ["Ready"]
    nodes = subprocess.run([*run, "get", "nodes", "--url", system.url], capture_output=True, text=True, timeout=60,
                           env=system.cli_env())
    assert "node1" in nodes.stdout
    pids = system.engine_pids()
    assert len(pids) == 1
    gone = subprocess.run([*run, "delete", "model", "cli-m", "--url", system.url], capture_output=True, text=True,
                          timeout=60, env=system.cli_env())
    assert gone.returncode == 0
    wait_for(lambda: not system.replicas("cli-m"), timeout=20, what="replicas removed")
    wait_for(lambda: not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                             for p in pids), timeout=10, what="engine stopped")
    again = subprocess.run([*run, "delete", "model", "cli-m", "--url", system.url], capture_output=True,
                           text=True, timeout=60, env=system.cli_env())
    assert again.returncode == 1 and "does not exist" in again.stderr


def test_cli_says_when_server_is_unreachable() -> None:
    """Without a server the CLI says so and how to point it elsewhere."""
    out = subprocess.run([*LLMGW, "get", "models", "--url", "http://127.0.0.1:9"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 1 and "cannot reach the control plane" in out.stderr and "LLMGW_URL" in out.stderr


def test_crashed_engine_is_replaced(system: System) -> None:
    """An engine killed from outside is reported Failed and replaced by a new shard that serves."""
    system.apply(sim_model("crashy"))
    system.wait_model("crashy")
    (pid,) = system.engine_pids()
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: system.replicas("crashy")[0]["attempt"] == 2 and system.replicas("crashy")[0]["phase"]
             == "Ready", timeout=30, interval=0.2, what="replacement Ready")
    assert system.replicas("crashy")[0]["failures"] == 0  # reset once the replacement was Ready
    system.wait_router("crashy", 1)
    (new_pid,) = system.engine_pids()
    assert new_pid != pid


def test_startup_timeout_replaces_slow_engine(system: System) -> None:
    """A shard not Ready within its startup timeout: its process is killed, a Failed event says it timed out,
    and a new attempt starts a new engine."""
    system.apply(sim_model("slow", args=["--startup-delay", "60"], startup_timeout="2s"))
    # The first attempt's engine, while it is still loading (it would take 60 s).
    first = wait_for(lambda: (r := system.replicas("slow")) and r[0]["attempt"] == 1 and r[0]["shard"]
                     and system.engine_pids() and r[0], timeout=20, interval=0.1, what="the slow engine launched")
    (slow_pid,) = system.engine_pids()
    timed_out = wait_for(lambda: [e for e in system.get("/api/v1/events?model=slow")["items"]
                                  if e["reason"] == "Failed" and "did not become ready within 2s" in e["message"]],
                         timeout=20, interval=0.2, what="an event saying the startup timed out")
    assert timed_out[0]["object"] == f"replica/{first['id']}" and timed_out[0]["kind"] == "Warning", timed_out
    wait_for(lambda: not _running(slow_pid), timeout=15, interval=0.1, what=f"the slow engine (pid {slow_pid}) gone")
    # Replaced: a later attempt, under a new shard id, with an engine process that is not the slow one.
    again = wait_for(lambda: (r := system.replicas("slow")) and r[0]["attempt"] >= 2 and r[0]["shard"]
                     and (system.engine_pids() - {slow_pid}) and r[0], timeout=30, interval=0.2,
                     what="a replacement engine started")
    assert again["id"] == first["id"] and again["shard"] != first["shard"], (first, again)
    assert slow_pid not in system.engine_pids()


def _running(pid: int) -> bool:
    """The process exists and is not a zombie waiting to be reaped."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_server_restart_keeps_engines(system: System) -> None:
    """Restarting the control plane reloads nothing: the agent reconnects and the same engine serves on."""
    system.apply(sim_model("steady"))
    system.wait_model("steady")
    before = system.engine_pids()
    endpoint = system.replicas("steady")[0]["endpoint"]
    system.stop_server()
    system.start_server()  # same data dir and ports
    wait_for(lambda: any(n["connected"] for n in system.get("/api/v1/nodes")["items"]), timeout=30,
             interval=0.2, what="agent reconnected")
    system.wait_model("steady")
    system.wait_router("steady", 1)
    assert system.engine_pids() == before
    assert system.replicas("steady")[0]["endpoint"] == endpoint and system.replicas("steady")[0]["attempt"] == 1


def test_lost_node_replica_moves_and_its_engine_is_stopped_on_return(tmp_path: os.PathLike[str]) -> None:
    """A node gone past its grace loses its replica to another node; when it comes back, its copy is stopped."""
    from pathlib import Path

    s = System(Path(tmp_path), node_grace_s=2)
    try:
        s.start_server()
        s.start_agent("node1")
        s.apply(sim_model("mover"))
        s.wait_model("mover")
        first = s.replicas("mover")[0]["node"]
        other = "node2" if first == "node1" else "node1"
        s.start_agent(other)
        (old_pid,) = s.engine_pids(first)
        s.stop_agent(first)  # SIGTERM: the engine outlives its agent
        assert psutil.pid_exists(old_pid)
        wait_for(lambda: s.replicas("mover")[0]["node"] == other and s.replicas("mover")[0]["phase"] == "Ready",
                 timeout=30, interval=0.2, what="replica moved")
        s.wait_router("mover", 1)
        s.start_agent(first)  # adopts its old engine, which no replica wants any more
        wait_for(lambda: not psutil.pid_exists(old_pid) or psutil.Process(old_pid).status() == psutil.STATUS_ZOMBIE,
                 timeout=20, interval=0.2, what="the returned node's duplicate stopped")
        r = httpx.post(f"{s.url}/v1/completions", json={"model": "mover", "prompt": "x", "max_tokens": 2},
                       timeout=10)
        assert r.status_code == 200
    finally:
        s.close()


def test_python_m_llmgw_help() -> None:
    """`python -m llmgw --help` lists the commands."""
    out = subprocess.run([sys.executable, "-m", "llmgw", "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and all(w in out.stdout for w in ("server", "agent", "up", "apply", "get"))


def test_standalone_router_keeps_serving_while_the_control_plane_is_down(system: System) -> None:
    """`llmgw router --control URL` routes from the control plane's table, and from its last one when it is gone."""
    from pathlib import Path

    from llmgw.testing.procs import Proc, free_port

    system.apply(sim_model("alone"))
    system.wait_model("alone")
    port = free_port()
    # A secure control plane serves its table only to a router with a credential of its own.
    made = system.request("POST", "/api/v1/routers", json={"name": "alone"})
    env = {**os.environ, "LLMGW_ROUTER_TOKEN": made.json()["token"]} if made.status_code == 201 else None
    router = Proc.start([*LLMGW, "router", "--control", system.url, "--port", str(port)],
                        log_path=Path(str(system.root)) / "router.log", env=env)
    try:
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        body = {"model": "alone", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
        def serving() -> bool:
            try:
                return httpx.post(url, json=body, timeout=10).status_code == 200
            except httpx.ConnectError:
                return False  # not listening yet

        wait_for(serving, timeout=20, interval=0.2, what="standalone router serving")
        system.stop_server()
        for _ in range(5):
            assert httpx.post(url, json=body, timeout=10).status_code == 200
        assert "llmgw_router_requests_total" in httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    finally:
        router.stop()


def test_killing_one_of_four_replicas_fails_no_request_that_had_no_byte_sent(system: System) -> None:
    """Under load, SIGKILL one of 4 engines: every request with no byte sent yet still succeeds elsewhere."""
    import threading

    system.apply(sim_model("four", replicas=4, args=["--decode-tps", "200"]))
    system.wait_model("four")
    system.wait_router("four", 4)
    ok = [0]
    before_bytes: list[str] = []  # failures the router should have hidden by retrying
    after_bytes: list[str] = []  # a stream cut mid-way: the client saw bytes, a retry would duplicate them
    stop = threading.Event()

    def load(stream: bool) -> None:
        body = {"model": "four", "prompt": "x", "max_tokens": 10, "stream": stream}
        with httpx.Client(timeout=30, trust_env=False) as c:
            while not stop.is_set():
                try:
                    if not stream:
                        r = c.post(f"{system.url}/v1/completions", json=body)
                        (before_bytes.append(f"{r.status_code} {r.text[:200]}") if r.status_code != 200
                         else ok.__setitem__(0, ok[0] + 1))
                        continue
                    with c.stream("POST", f"{system.url}/v1/completions", json=body) as r:
                        if r.status_code != 200:
                            before_bytes.append(f"stream {r.status_code}")
                            continue
                        lines = list(r.iter_lines())
                    (after_bytes.append("error event") if any('"error"' in x for x in lines)
                     else ok.__setitem__(0, ok[0] + 1))
                except httpx.HTTPError as e:
                    before_bytes.append(repr(e))

    threads = [threading.Thread(target=load, args=(i % 2 == 0,)) for i in range(4)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: ok[0] >= 50, timeout=20, what="load running")
        os.kill(sorted(system.engine_pids())[0], signal.SIGKILL)
        seen = ok[0]
        wait_for(lambda: ok[0] >= seen + 100, timeout=30, what="requests served after the kill")
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    assert before_bytes == [], before_bytes[:5]
    print(f"\nmeasured: {ok[0]} requests ok, 0 failed before a byte was sent, {len(after_bytes)} cut mid-stream")
