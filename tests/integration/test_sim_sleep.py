"""The sim engine's sleep mode, vLLM's routes over real HTTP with the real openai client: off unless
--enable-sleep-mode and VLLM_SERVER_DEV_MODE=1; asleep it frees its reported memory and refuses
completions; awake again it serves, in the same process."""

from __future__ import annotations

import json
import os
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from llmgw.testing import procs

MODEL = "sim-sleepy"


def start(tmp_path: Path, name: str, *flags: str, dev: bool = True) -> tuple[procs.Proc, str]:
    port = procs.free_port()
    env = {k: v for k, v in os.environ.items() if k != "VLLM_SERVER_DEV_MODE"}
    if dev:
        env["VLLM_SERVER_DEV_MODE"] = "1"
    argv = [sys.executable, "-m", "llmgw.sim.engine", "--port", str(port), "--model", MODEL, *flags]
    proc = procs.Proc.start(argv, env=env, log_path=tmp_path / f"{name}.log")
    url = f"http://127.0.0.1:{port}"
    try:
        proc.wait_http(url + "/health", timeout=20)
    except BaseException:
        proc.stop()
        raise
    return proc, url


def call(method: str, url: str) -> tuple[int, bytes]:
    req = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def stats(url: str) -> dict[str, Any]:
    return json.loads(call("GET", url + "/sim/stats")[1])["sleep"]


@pytest.fixture
def sleepy(tmp_path: Path) -> Iterator[tuple[procs.Proc, str]]:
    proc, url = start(tmp_path, "sleepy", "--enable-sleep-mode", "--wake-delay", "0.05", "--sleep-delay", "0.01",
                      "--level2-extra-delay", "0.2", "--memory-mib", "8000", "--sleep-memory-mib", "300")
    try:
        yield proc, url
    finally:
        proc.stop()


def test_sleep_frees_memory_refuses_requests_and_wake_serves_again(sleepy: tuple[procs.Proc, str]) -> None:
    proc, url = sleepy
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    assert client.completions.create(model=MODEL, prompt="hi", max_tokens=2).choices[0].text
    assert json.loads(call("GET", url + "/is_sleeping")[1]) == {"is_sleeping": False}
    assert stats(url)["memory_mib"] == 8000

    assert call("POST", url + "/sleep?level=1") == (200, b"")
    assert json.loads(call("GET", url + "/is_sleeping")[1]) == {"is_sleeping": True}
    assert stats(url) == {"sleeping": True, "level": 1, "sleeps": 1, "wakes": 0, "memory_mib": 300,
                          "pid": proc.pid}
    with pytest.raises(openai.APIStatusError) as e:
        client.completions.create(model=MODEL, prompt="hi", max_tokens=2)
    assert e.value.status_code == 503 and "sleeping" in str(e.value)

    assert call("POST", url + "/wake_up") == (200, b"")
    assert json.loads(call("GET", url + "/is_sleeping")[1]) == {"is_sleeping": False}
    assert client.completions.create(model=MODEL, prompt="hi", max_tokens=2).choices[0].text
    assert stats(url)["memory_mib"] == 8000 and stats(url)["wakes"] == 1
    assert proc.popen.poll() is None  # the same process throughout


def test_bad_level_is_refused_and_level_2_is_kept(sleepy: tuple[procs.Proc, str]) -> None:
    _, url = sleepy
    status, body = call("POST", url + "/sleep?level=3")
    assert status == 400 and b"level must be 1 or 2" in body
    assert call("POST", url + "/sleep?level=2")[0] == 200
    assert stats(url)["level"] == 2


@pytest.mark.parametrize(("flags", "dev"), [((), True), (("--enable-sleep-mode",), False)])
def test_routes_absent_without_sleep_mode_or_dev_mode(tmp_path: Path, flags: tuple[str, ...], dev: bool) -> None:
    proc, url = start(tmp_path, "plain", *flags, dev=dev)
    try:
        assert call("POST", url + "/sleep?level=1")[0] == 404
        assert call("GET", url + "/is_sleeping")[0] == 404
    finally:
        proc.stop()


def test_sleep_with_mode_wait_lets_the_request_in_flight_finish(sleepy: tuple[procs.Proc, str]) -> None:
    """What the agent asks (``mode=wait``): a request that reached the engine is answered, then it sleeps."""
    _, url = sleepy
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    done: list[str] = []
    t = threading.Thread(target=lambda: done.append(
        client.completions.create(model=MODEL, prompt="hi", max_tokens=100).choices[0].text))
    t.start()
    procs.wait_for(lambda: json.loads(call("GET", url + "/sim/stats")[1])["running"] == 1, timeout=10,
                   what="request running")
    assert call("POST", url + "/sleep?level=1&mode=wait")[0] == 200
    t.join(timeout=30)
    assert done and len(done[0].split()) == 100  # answered whole, not aborted
    assert stats(url)["sleeping"]
    status, body = call("POST", url + "/sleep?level=1&mode=later")
    assert status == 400 and b"mode must be one of abort, wait, keep" in body
