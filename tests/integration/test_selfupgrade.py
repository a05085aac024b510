"""The agent's self-upgrade install, with real venvs and real pip runs (``llmgw.agent.selfupgrade``): what fails says
why and leaves nothing of its own behind, and never touches what llmgw did not make. The whole path, re-exec
included, is tests/e2e/test_node_upgrade.py."""

from __future__ import annotations

import asyncio
import fcntl
import json
import subprocess
import sys
from pathlib import Path

from llmgw.agent import selfupgrade
from llmgw.core.agentupgrade import State, UpgradeRequest, UpgradeStatus
from llmgw.testing import wheelhouse

ARGV = ["/x/llmgw/__main__.py", "agent", "--server", "127.0.0.1:1"]


def _attempt(state_dir: Path, req: UpgradeRequest) -> tuple[list[UpgradeStatus], list[Path]]:
    said: list[UpgradeStatus] = []
    restarted: list[Path] = []
    up = selfupgrade.SelfUpgrade(state_dir, running_version="0.2.0", restart=restarted.append, argv=ARGV)

    async def go() -> None:
        up.begin(req, said.append)
        assert up._task is not None
        await up._task
        await asyncio.sleep(0)  # the steps the worker thread handed to the loop

    asyncio.run(go())
    return said, restarted


def test_a_version_the_index_lacks_fails_with_pips_reason_and_its_venv_is_removed(tmp_path: Path) -> None:
    wh = tmp_path / "wheelhouse"
    wheelhouse.build_sim_wheel(wh, "0.3.1")  # an index with something in it, but no llmgw
    said, restarted = _attempt(tmp_path / "state", UpgradeRequest("a1", "9.9.9", str(wh), True))
    assert restarted == []
    assert said[-1].state is State.FAILED, said
    assert "pip install exited 1" in said[-1].message and "llmgw==9.9.9" in said[-1].message, said[-1].message
    assert any("llmgw" in line for line in said[-1].last_output)
    assert [s.message for s in said[:2]] == ["creating the venv", "resolving"]
    assert not (tmp_path / "state" / "llmgw" / "9.9.9").exists()
    assert (tmp_path / "state" / "llmgw").stat().st_mode & 0o777 == 0o711


def test_a_directory_llmgw_did_not_make_is_left_alone(tmp_path: Path) -> None:
    theirs = tmp_path / "state" / "llmgw" / "9.9.9"
    theirs.mkdir(parents=True)
    (theirs / "keep.txt").write_text("an operator's")
    said, _ = _attempt(tmp_path / "state", UpgradeRequest("a1", "9.9.9", "http://127.0.0.1:1/", True))
    assert said[-1].state is State.FAILED and "llmgw did not create it" in said[-1].message and "move it aside" in \
        said[-1].message
    assert (theirs / "keep.txt").read_text() == "an operator's"


def test_two_attempts_never_share_a_venv(tmp_path: Path) -> None:
    root = tmp_path / "state" / "llmgw"
    root.mkdir(parents=True)
    with open(root / ".9.9.9.lock", "a+b") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)  # another agent process (a second one on the same state dir)
        said, _ = _attempt(tmp_path / "state", UpgradeRequest("a1", "9.9.9", "http://127.0.0.1:1/", True))
    assert said[-1].state is State.FAILED and "another process is installing llmgw 9.9.9" in said[-1].message
    assert not (root / "9.9.9").exists()


def test_the_re_exec_passes_only_stdin_stdout_and_stderr(tmp_path: Path) -> None:
    """A process with an inheritable file and a listening socket execs through ``exec_into``: the new program
    (here a stand-in for the new venv's Python, which prints its descriptors and arguments) has neither."""
    stand_in = tmp_path / "python"
    stand_in.write_text(f"#!{sys.executable}\n"
                        "import json, os, sys\n"
                        "print(json.dumps({'fds': sorted(int(f) for f in os.listdir('/proc/self/fd')), "
                        "'argv': sys.argv[1:]}))\n")
    stand_in.chmod(0o755)
    leaky = tmp_path / "leaky.log"
    child = ("import os, socket, sys\n"
             "from pathlib import Path\n"
             "from llmgw.agent import selfupgrade\n"
             f"f = open({str(leaky)!r}, 'a'); os.set_inheritable(f.fileno(), True)\n"
             "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); os.set_inheritable(s.fileno(), True)\n"
             f"selfupgrade.exec_into(Path({str(stand_in)!r}), ['llmgw', 'agent', '--server', 'h:1'])\n")
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60, check=True,
                         stdin=subprocess.DEVNULL)
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    assert doc["argv"] == ["-I", "-m", "llmgw", "agent", "--server", "h:1"]
    # 0-2, and the one listdir itself opened to read /proc/self/fd.
    assert len([fd for fd in doc["fds"] if fd > 2]) <= 1, doc["fds"]
