"""Back up a running cluster, destroy the control plane's data directory, restore it elsewhere: the same cluster.

Real processes throughout: `llmgw server` (SQLite, loopback) with scheduled backups on, an agent that joined
with a token and holds a mutual-TLS stream, a sim engine replica, the real `openai` client through the
server's router. With a model, a project, an API key in it, a user and some usage in place, `llmgw backup`
runs while the server serves; the server is stopped (SIGTERM: the agent and its engine keep running), its data
directory deleted, `llmgw restore` writes a new one, and `llmgw server` starts on it at the same addresses.
Then the agent is back on its old certificate (the restored CA), the engine is the same process (adopted, not
restarted), and the model, key, user, project, usage and the admin's session are all there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import openai

from llmgw.control.backup import schedule
from llmgw.testing.procs import wait_for
from llmgw.testing.system import LLMGW, System, sim_model

PASS = "a long passphrase for the test"
MODEL = "kept"


def _llmgw(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "LLMGW_DATABASE"}
    return subprocess.run([*LLMGW, *args], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
                          env={**env, "LLMGW_BACKUP_PASSPHRASE": PASS})


def _usage_of(system: System, key_id: str) -> int:
    rows = system.get("/api/v1/usage?since=1d&by=key")["rows"]
    return int(next((r["requests"] for r in rows if r.get("group") == key_id), 0))


def _ask(system: System, key: str) -> Any:
    client = openai.OpenAI(base_url=f"{system.url}/v1", api_key=key, max_retries=0, timeout=30)
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=8)


def _answers(system: System, key: str) -> bool:
    try:
        return bool(_ask(system, key).choices[0].message.content)
    except openai.APIStatusError as e:
        assert e.status_code == 503, e  # no endpoint yet; a refused key (401) is a failure at once
        return False


def test_a_restored_control_plane_is_the_same_cluster_and_adopts_the_engines(tmp_path: Path) -> None:
    scheduled = tmp_path / "scheduled"
    pass_file = tmp_path / "backup-pass"
    pass_file.write_text(PASS + "\n")
    pass_file.chmod(0o600)
    system = System(tmp_path / "cp", server_args=["--backup-dir", str(scheduled), "--backup-every", "2s",
                                                  "--backup-keep", "2", "--backup-passphrase-file", str(pass_file)])
    try:
        system.start_server()
        system.start_agent("node1")
        system.apply(sim_model(MODEL))
        system.wait_model(MODEL, timeout=60)
        system.wait_router(MODEL, 1)
        assert system.request("POST", "/api/v1/projects", json={"name": "team"}).status_code == 201
        made = system.request("POST", "/api/v1/keys", json={"name": "app", "project": "team"})
        assert made.status_code == 201, made.text
        key, key_id = made.json()["key"], made.json()["id"]
        assert system.request("POST", "/api/v1/users", json={"name": "pat", "role": "viewer"}).status_code == 201
        for _ in range(3):
            assert _ask(system, key).choices[0].message.content
        wait_for(lambda: _usage_of(system, key_id) == 3, timeout=30, interval=0.2, what="3 requests stored")
        engines = system.engine_pids()
        assert engines
        replica = system.replicas(MODEL)[0]

        # Scheduled backups: written on the leader, the 2 newest kept, each an event.
        wait_for(lambda: len([e for e in system.get("/api/v1/events?object=cluster/backup")["items"]
                              if e["reason"] == "BackupWritten"]) >= 3, timeout=60, interval=0.5,
                 what="three scheduled backups")
        assert len(schedule.ours(scheduled)) == 2
        assert "llmgw_backup_last_success_timestamp_seconds" in system.request("GET", "/metrics").text

        backup = tmp_path / "elsewhere" / "cluster.llmgwbak"
        backup.parent.mkdir()
        done = _llmgw("backup", str(backup), "--data-dir", str(system.data_dir))  # while the server runs
        assert done.returncode == 0, done.stderr
        assert oct(backup.stat().st_mode & 0o777) == "0o600"

        system.stop_server()  # SIGTERM; the agent and its engine keep running
        assert system.engine_pids() == engines
        shutil.rmtree(system.data_dir)  # the control plane's machine is gone

        new = tmp_path / "new-machine" / "data"
        done = _llmgw("restore", str(backup), "--data-dir", str(new))
        assert done.returncode == 0, done.stderr
        system.data_dir = new
        system.start_server()  # the same ports: the agent dials the address it always did

        wait_for(lambda: any(n["id"] == "node1" and n["connected"] for n in system.get("/api/v1/nodes")["items"]),
                 timeout=60, interval=0.2, what="node1 reconnected to the restored control plane")
        system.wait_model(MODEL, timeout=30)
        node = next(n for n in system.get("/api/v1/nodes")["items"] if n["id"] == "node1")
        assert (node.get("status") or "Ready") == "Ready"
        assert system.engine_pids() == engines, "an engine was restarted instead of adopted"
        after = system.replicas(MODEL)[0]
        assert (after["id"], after["endpoint"], after["attempt"]) == (replica["id"], replica["endpoint"],
                                                                      replica["attempt"])
        # The old API key works through the router (once its table has the replica), the usage it made before
        # is there and goes on.
        wait_for(lambda: _answers(system, key), timeout=30, interval=0.2, what="the old key served")
        wait_for(lambda: _usage_of(system, key_id) == 4, timeout=30, interval=0.2, what="the 4th request stored")
        assert "pat" in {u["name"] for u in system.get("/api/v1/users")["items"]}
        assert "team" in {p["name"] for p in system.get("/api/v1/projects")["items"]}
        assert "app" in {k["name"] for k in system.get("/api/v1/keys")["items"]}
        assert system.engine_pids() == engines
        agent_log = (system.root / "agent-node1.log").read_text(errors="replace")
        # Joined once, registered twice: it came back on its certificate, which the restored CA verifies.
        assert agent_log.count("llmgw.agent.join: joined the cluster") == 1
        assert agent_log.count("registered with") == 2
    finally:
        system.close()
