"""`llmgw token create` over REST (``POST /api/v1/tokens``): an administrator's, from anywhere, printing the
server's own join address.

Found by a careless operator: the command worked only on the control plane's host with its data directory,
and printed join port 8082 even when the server listened on another. Real server, real CLI, real agent.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

from llmgw.testing.procs import Proc, wait_for
from llmgw.testing.system import LLMGW, System


def _cli(s: System, *args: str, token: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LLMGW_TOKEN": token, "XDG_CONFIG_HOME": str(s.root / "config"),
           "XDG_DATA_HOME": str(s.root / "nowhere")}
    env.pop("LLMGW_DATABASE", None)
    return subprocess.run([*LLMGW, *args], capture_output=True, text=True, timeout=60, env=env,
                          stdin=subprocess.DEVNULL)


def test_token_create_over_rest_prints_the_real_join_port_and_an_agent_joins_with_it(tmp_path: Path) -> None:
    """A logged-in admin away from the data directory gets a join command naming the server's join port (not
    8082); an agent joins with exactly that command; the audit log has the token's id, never its secret."""
    s = System(tmp_path)
    try:
        s.start_server()
        assert s.join_port != 8082
        made = _cli(s, "token", "create", "--url", s.url, "--ttl", "10m", token=s.token)
        assert made.returncode == 0, made.stderr
        argv = shlex.split(made.stdout.strip())
        assert argv[:3] == ["llmgw", "agent", "join"], made.stdout
        assert argv[argv.index("--server") + 1] == f"127.0.0.1:{s.join_port}", made.stdout
        assert argv[argv.index("--ca-hash") + 1] == s.ca_hash
        token = argv[argv.index("--token") + 1]

        agent = Proc.start([*LLMGW, *argv[1:], "--node-id", "n7", "--state-dir", str(tmp_path / "n7"),
                            "--heartbeat-interval", "1"], log_path=tmp_path / "agent-n7.log")
        s.agents["n7"] = agent
        wait_for(lambda: any(n["id"] == "n7" and n["connected"] for n in s.get("/api/v1/nodes")["items"]),
                 timeout=30, what="n7 joined with the printed command and connected")

        rows = [e for e in s.get("/api/v1/audit")["items"] if e["action"] == "token create"]
        assert [(e["object"], e["outcome"]) for e in rows] == [(f"token/{token.split('.')[0]}", "ok")], rows
        assert all(token.split(".")[1] not in str(e) for e in s.get("/api/v1/audit")["items"])
    finally:
        s.close()


def test_only_an_administrator_makes_a_token(tmp_path: Path) -> None:
    """An operator and a viewer are refused (403, saying the role it needs), and nothing is made."""
    s = System(tmp_path)
    try:
        s.start_server()
        for role in ("operator", "viewer"):
            made = s.request("POST", "/api/v1/users", json={"name": f"u-{role}", "role": role}).json()
            login = s.request("POST", "/api/v1/login", json={"username": made["name"], "password": made["password"]})
            refused = _cli(s, "token", "create", "--url", s.url, token=login.json()["token"])
            # The permission table says a join token is an admin's, to a viewer and an operator alike.
            needs = "needs admin"
            assert refused.returncode == 1 and needs in refused.stderr, refused.stderr
            assert "llmgw agent join" not in refused.stdout
        assert [e["outcome"] for e in s.get("/api/v1/audit")["items"] if e["action"] == "token create"] == \
            ["refused", "refused"]
        # Bad input is refused with the field named.
        bad = s.request("POST", "/api/v1/tokens", json={"ttl_s": -1})
        assert bad.status_code == 400 and "ttl_s" in bad.json()["error"]["message"], bad.text
        bad_node = s.request("POST", "/api/v1/tokens", json={"node": "../x"})
        assert bad_node.status_code == 422 and "not a name" in bad_node.json()["error"]["message"], bad_node.text
    finally:
        s.close()
