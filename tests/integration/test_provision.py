"""Engine installs end to end (issue 14): a real agent, a stand-in control plane sending Provision, and a
wheelhouse served over HTTP on 127.0.0.1 (the sim packaged as a wheel here, aiohttp and xllamacpp fetched
through pip's cache once). The agent installs into fresh venvs from that page only, probes, reports the
installs on its heartbeat, and a replica runs from the install's python.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import queue
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import httpx
import psutil
import pytest

from llmgw.agent.provision import installer as installer_mod
from llmgw.api import convert
from llmgw.api.v1 import agent_pb2 as pb
from llmgw.api.v1 import agent_pb2_grpc
from llmgw.core import provision as prov
from llmgw.core import skew
from llmgw.core.shards import ShardSpec, ShardState, ShardStatus
from llmgw.testing import fakecontrol, tiny_gguf, wheelhouse
from llmgw.testing import system as system_mod
from llmgw.testing.procs import Proc, free_port, wait_for
from llmgw.testing.system import LLMGW

pytestmark = pytest.mark.timeout(400)

LLAMACPP = importlib.metadata.version("xllamacpp")
SIM = prov.EngineWant("sim", "0.3.1")
XLLAMA = prov.EngineWant("llamacpp", LLAMACPP)
S = prov.InstallState


@pytest.fixture(scope="module")
def index_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The wheelhouse, a flat --find-links page served by a real HTTP server on loopback."""
    wh = wheelhouse.fill(tmp_path_factory.mktemp("wheelhouse"))
    with wheelhouse.serve(wh, log_path=wh.parent / "http.log") as url:
        yield url


class Control(agent_pb2_grpc.AgentServiceServicer):
    """A control plane that accepts the agent, sends what the test queues, and keeps what the agent reports."""

    def __init__(self) -> None:
        self.outbox: queue.Queue[pb.ControlMessage] = queue.Queue()
        self.installs: list[tuple[prov.EngineInstall, ...]] = []
        self.engines: list[tuple[tuple[str, str], ...]] = []
        self.statuses: dict[str, ShardStatus] = {}
        self.registers = 0
        self._seq = 100

    def send(self, **body: object) -> None:
        self._seq += 1
        self.outbox.put(pb.ControlMessage(seq=self._seq, **body))  # type: ignore[arg-type]

    def provision(self, p: prov.Provision) -> None:
        self.send(provision=convert.provision_to_pb(p))

    def latest(self) -> dict[prov.EngineWant, prov.EngineInstall]:
        return {i.want: i for i in (self.installs[-1] if self.installs else ())}

    async def Connect(self, request_iterator: AsyncIterator[pb.AgentMessage],  # noqa: N802
                      context: grpc.aio.ServicerContext) -> AsyncIterator[pb.ControlMessage]:
        first = await anext(request_iterator)
        self.registers += 1
        self.installs.append(convert.installs_from_pb(first.register.installs))
        self.engines.append(convert.inventory_from_register(first.register).engines)
        yield pb.ControlMessage(seq=1, ack=pb.Ack(seq=first.seq, ok=True, protocol=skew.PROTOCOL))
        reader = asyncio.create_task(self._read(request_iterator))
        try:
            while not reader.done():
                try:
                    msg = await asyncio.to_thread(self.outbox.get, True, 0.2)
                except queue.Empty:
                    continue
                yield msg
        finally:
            reader.cancel()

    async def _read(self, it: AsyncIterator[pb.AgentMessage]) -> None:
        async for msg in it:
            kind = msg.WhichOneof("body")
            if kind == "heartbeat":
                hb = convert.heartbeat_from_pb(msg.heartbeat)
                if hb.installs is not None:
                    self.installs.append(hb.installs)
                if hb.engines is not None:
                    self.engines.append(hb.engines)
            elif kind == "shard_status":
                st = convert.status_from_pb(msg.shard_status)
                self.statuses[st.shard_id] = st


class Node:
    """A real agent (--insecure) against the stand-in control plane, restartable on the same directories."""

    def __init__(self, tmp_path: Path, port: int, recheck: str) -> None:
        self.tmp, self.port, self.recheck = tmp_path, port, recheck
        self.engines_dir = tmp_path / "engines"
        self.proc: Proc | None = None
        self.starts = 0

    def start(self) -> Proc:
        self.starts += 1
        self.proc = Proc.start([*LLMGW, "agent", "--insecure", "--server", f"127.0.0.1:{self.port}", "--node-id",
                                "n1", "--state-dir", str(self.tmp / "state"), "--heartbeat-interval", "0.5",
                                "--stop-engines-on-exit"],
                               env={"LLMGW_AGENT_ENGINES_DIR": str(self.engines_dir),
                                    "LLMGW_AGENT_ENGINE_RECHECK_S": self.recheck,
                                    "LLMGW_AGENT_OWN_PYTHON_ENGINES": "false",
                                    # the test's tiny.gguf lies beside the state dir, not under its weights
                                    "LLMGW_AGENT_SOURCE_ROOTS": str(self.tmp)},
                               log_path=self.tmp / f"agent-{self.starts}.log")
        return self.proc

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop(timeout=20)
            self.proc = None


@pytest.fixture
def node(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[Control, Node]]:
    control = Control()
    port = free_port()
    ready, stop = threading.Event(), threading.Event()
    server = threading.Thread(target=fakecontrol.serve, args=(control, port, ready, stop), daemon=True)
    server.start()
    n = Node(tmp_path, port, getattr(request, "param", "600"))
    try:
        assert ready.wait(10)
        n.start()
        wait_for(lambda: control.registers, timeout=30, what="the agent's Register")
        yield control, n
    finally:
        n.stop()
        stop.set()
        server.join(10)


@pytest.fixture
def agent(node: tuple[Control, Node]) -> tuple[Control, Path, Proc]:
    control, n = node
    assert n.proc is not None
    return control, n.engines_dir, n.proc


def _wait_states(control: Control, want: dict[prov.EngineWant, prov.InstallState], *, timeout: float = 180) -> dict[
        prov.EngineWant, prov.EngineInstall]:
    wait_for(lambda: all(w in control.latest() and control.latest()[w].state is s for w, s in want.items()),
             timeout=timeout, what=f"installs {want}; last reported: {control.latest()}")
    return control.latest()


def _spec(shard_id: str, engine: str, *, source: str = "") -> ShardSpec:
    return ShardSpec(shard_id=shard_id, replica_id=shard_id.rsplit("-", 1)[0], model="m", engine=engine,
                     served_name="m", source=source, threads=1)


def test_sim_and_xllamacpp_installed_probed_reported_and_run_by_a_replica(
        agent: tuple[Control, Path, Proc], index_url: str, tmp_path: Path) -> None:
    """Provision -> fresh venvs with a lock and a marker -> Ready (seen to run) on the heartbeat, in the engines
    the node reports, and replicas of both engines run from their install's python."""
    control, engines_dir, _ = agent
    # own_python_engines off: the agent's own xllamacpp is not reported, only the built-in sim (llmgw's version).
    assert [name for name, _ in control.engines[-1]] == ["sim"] and ("sim", "0.3.1") not in control.engines[-1]
    control.provision(prov.Provision(wants=(SIM, XLLAMA), index_url=index_url, find_links=True))
    got = _wait_states(control, {SIM: S.Ready, XLLAMA: S.Ready})
    seen_states = {i.state for batch in control.installs for i in batch}
    assert S.Installing in seen_states  # progress was reported on the way
    for want, variant in ((SIM, "py"), (XLLAMA, "cpu")):
        path = engines_dir / f"{want.engine}-{want.version}-{variant}"
        assert got[want].variant == variant and got[want].path == str(path)
        assert "answered /health" in got[want].message, got[want].message
        assert (path / ".llmgw-install.json").is_file() and (path / "bin" / "python").exists()
    assert "llmgw-sim-engine==0.3.1" in (engines_dir / "sim-0.3.1-py" / "llmgw-lock.txt").read_text()
    assert f"xllamacpp=={LLAMACPP}" in (engines_dir / f"llamacpp-{LLAMACPP}-cpu" / "llmgw-lock.txt").read_text()
    wait_for(lambda: {("sim", "0.3.1"), ("llamacpp", LLAMACPP)} <= set(control.engines[-1]), timeout=30,
             what=f"both installs among the engines reported; last: {control.engines[-1]}")

    model = tiny_gguf.write_tiny_llama_gguf(tmp_path / "tiny.gguf")
    control.send(start_shard=pb.StartShard(spec=convert.spec_to_pb(_spec("s-abc123-1", "sim"))))
    control.send(start_shard=pb.StartShard(spec=convert.spec_to_pb(
        _spec("l-abc123-1", "llamacpp", source=f"file://{model}"))))
    wait_for(lambda: all(control.statuses.get(s) is not None and control.statuses[s].state is ShardState.READY
                         for s in ("s-abc123-1", "l-abc123-1")), timeout=90,
             what=f"both replicas Ready; statuses: {control.statuses}")
    for shard_id, install in (("s-abc123-1", "sim-0.3.1-py"), ("l-abc123-1", f"llamacpp-{LLAMACPP}-cpu")):
        st = control.statuses[shard_id]
        program = Path(f"/proc/{st.pid}/cmdline").read_bytes().split(b"\0")[0].decode()
        assert program == str(engines_dir / install / "bin" / "python"), program
        assert httpx.get(f"{st.endpoint}/health", timeout=10, trust_env=False).status_code == 200


@pytest.mark.parametrize("node", ["1"], indirect=True)
def test_a_broken_install_is_found_by_the_recheck_and_installed_again(
        agent: tuple[Control, Path, Proc], index_url: str) -> None:
    """A module file deleted under a Ready install is found by the next re-check (1 s here), and the install is
    made again from a fresh venv and is Ready once more."""
    control, engines_dir, proc = agent
    control.provision(prov.Provision(wants=(SIM,), index_url=index_url, find_links=True))
    _wait_states(control, {SIM: S.Ready})
    module = next((engines_dir / "sim-0.3.1-py").glob("lib/python*/site-packages/llmgw_sim_engine/__main__.py"))
    module.unlink()
    reported = len(control.installs)
    wait_for(lambda: module.is_file() and control.latest()[SIM].state is S.Ready
             and any(i.state is not S.Ready for batch in control.installs[reported:] for i in batch),
             timeout=120, what=f"the install made again; last reported: {control.latest()}")
    log = proc.log_tail(400)
    assert "the re-check of sim 0.3.1" in log and "installing it again" in log, log


def test_a_version_the_index_lacks_fails_with_pips_words_and_a_retry_time(
        agent: tuple[Control, Path, Proc], index_url: str) -> None:
    """sim 9.9 is not in the wheelhouse: Failed, with pip's own error as the message and in the last lines, and a
    retry a minute on (backoff); the sim that exists beside it is installed all the same."""
    control, _, _ = agent
    missing = prov.EngineWant("sim", "9.9")
    control.provision(prov.Provision(wants=(missing, SIM), index_url=index_url, find_links=True))
    got = _wait_states(control, {missing: S.Failed, SIM: S.Ready})
    failed = got[missing]
    words = "Could not find a version that satisfies the requirement llmgw-sim-engine==9.9"
    assert words in failed.message and any(words in line for line in failed.last_output), failed
    assert failed.message.startswith("pip install exited 1: ERROR:"), failed.message
    assert 50 <= failed.retry_unix - failed.checked_unix <= 70, failed
    assert failed.retry_unix > time.time() + 30


def test_no_index_configured_is_failed_with_what_to_do(agent: tuple[Control, Path, Proc]) -> None:
    """A Provision naming no index installs nothing from anywhere: Failed, saying which server flag to set."""
    control, engines_dir, _ = agent
    control.provision(prov.Provision(wants=(SIM,)))
    got = _wait_states(control, {SIM: S.Failed}, timeout=60)
    assert got[SIM].message == "no package index is configured: start the server with --engine-index URL"
    assert not (engines_dir / "sim-0.3.1-py").exists()


def test_a_restarted_agent_keeps_its_ready_installs_after_probing_them(
        node: tuple[Control, Node], index_url: str) -> None:
    """The next agent finds the install by its marker, probes it (no reinstall) and registers it Ready, with no
    Provision sent to it."""
    control, n = node
    control.provision(prov.Provision(wants=(SIM,), index_url=index_url, find_links=True))
    _wait_states(control, {SIM: S.Ready})
    lock = n.engines_dir / "sim-0.3.1-py" / "llmgw-lock.txt"
    made = lock.stat().st_mtime_ns
    n.stop()
    registered = control.registers
    n.start()
    wait_for(lambda: control.registers > registered, timeout=30, what="the second agent's Register")
    got = _wait_states(control, {SIM: S.Ready}, timeout=60)
    assert "answered /health" in got[SIM].message and got[SIM].checked_unix > 0
    assert lock.stat().st_mtime_ns == made  # probed, not installed again
    wait_for(lambda: ("sim", "0.3.1") in control.engines[-1], timeout=30, what="sim 0.3.1 among the engines")


def test_removal_refused_while_a_shard_runs_it_then_done_and_a_foreign_dir_never_touched(
        agent: tuple[Control, Path, Proc], index_url: str) -> None:
    """Provision.remove of an install a shard runs from is refused naming the shard; once it stopped, the install's
    directory goes. A directory at an install's path that llmgw did not make is never replaced or removed."""
    control, engines_dir, _ = agent
    foreign = engines_dir / "sim-0.2.0-py"
    foreign.mkdir(parents=True)
    (foreign / "keep").write_text("an operator's")
    other = prov.EngineWant("sim", "0.2.0")
    control.provision(prov.Provision(wants=(SIM, other), index_url=index_url, find_links=True))
    got = _wait_states(control, {SIM: S.Ready, other: S.Failed})
    assert got[other].message == (f"{foreign} exists and llmgw did not create it (it has no .llmgw-install.json); "
                                  "llmgw never removes a directory it did not make: move it aside"), got[other]
    control.send(start_shard=pb.StartShard(spec=convert.spec_to_pb(_spec("s-abc123-1", "sim"))))
    wait_for(lambda: control.statuses.get("s-abc123-1") is not None
             and control.statuses["s-abc123-1"].state is ShardState.READY, timeout=60, what="the sim replica")
    control.provision(prov.Provision(wants=(), index_url=index_url, find_links=True, remove=(SIM, other)))
    wait_for(lambda: control.latest()[SIM].message.startswith("not removed"), timeout=30,
             what=f"the refusal; last: {control.latest()}")
    assert control.latest()[SIM].message == ("not removed: shard s-abc123-1 runs it; stop or move those replicas, "
                                             "then remove it again")
    assert (engines_dir / "sim-0.3.1-py" / "bin" / "python").exists()
    assert (foreign / "keep").read_text() == "an operator's"
    assert other not in control.latest()  # forgotten, its directory left as it was

    control.send(stop_shard=pb.StopShard(shard_id="s-abc123-1", reason="test"))
    wait_for(lambda: control.statuses["s-abc123-1"].state is ShardState.STOPPED, timeout=30, what="the stop")
    control.provision(prov.Provision(wants=(), index_url=index_url, find_links=True, remove=(SIM,)))
    wait_for(lambda: SIM not in control.latest(), timeout=30, what=f"the removal; last: {control.latest()}")
    assert not (engines_dir / "sim-0.3.1-py").exists()
    assert (foreign / "keep").read_text() == "an operator's"


NO_SUCH = "llmgw-no-such-package"


def _sim_needing_an_os_package(want: prov.EngineWant, node: prov.NodeProfile) -> prov.Variant | prov.NoVariant:
    v = prov.choose_variant(want, node)
    assert isinstance(v, prov.Variant)
    return prov.Variant(v.name, v.packages, v.distribution, v.probe, module=v.module,
                        os_packages=(("debian", (NO_SUCH,)), ("rhel", (NO_SUCH,))))


def _install_once(tmp_path: Path, index_url: str, *, root: bool, allowed: bool) -> prov.EngineInstall:
    async def go() -> prov.EngineInstall:
        loop, done = asyncio.get_running_loop(), asyncio.Event()
        inst = installer_mod.Installer(tmp_path / "engines", profile=lambda: prov.NodeProfile(
            arch="x86_64", os_family=installer_mod.ospkg.os_family()), is_root=lambda: root,
            choose=_sim_needing_an_os_package, on_change=lambda: loop.call_soon_threadsafe(done.set))
        task = asyncio.create_task(inst.run())
        try:
            inst.apply(prov.Provision(wants=(SIM,), index_url=index_url, find_links=True, os_packages=allowed))
            await done.wait()  # told after the install ended, Ready or Failed
            return inst.installs()[0]
        finally:
            task.cancel()

    return asyncio.run(asyncio.wait_for(go(), 120))


def test_a_missing_os_package_is_reported_with_the_command_when_the_agent_may_not_install_it(
        tmp_path: Path, index_url: str) -> None:
    """Not root (or not allowed): the package database is asked, the missing package is reported with the apt-get
    (or dnf) command, nothing is installed by the agent, and the pip part goes on."""
    got = _install_once(tmp_path, index_url, root=False, allowed=True)
    family = installer_mod.ospkg.os_family()
    assert got.state is S.Ready and got.missing_os_packages == (NO_SUCH,), got
    assert got.os_install_command == prov.os_install_command(family, (NO_SUCH,)) and NO_SUCH in got.os_install_command


def test_a_missing_os_package_is_installed_by_a_root_agent_when_allowed(tmp_path: Path, index_url: str) -> None:
    """Root and allowed: the package manager is run; a package it cannot find fails the install with its words."""
    if installer_mod.ospkg.os_family() != "debian":
        pytest.fail("this test reads apt-get's refusal; the test machines are Debian")
    got = _install_once(tmp_path, index_url, root=True, allowed=True)
    assert got.state is S.Failed and got.message.startswith("apt-get install exited 100:"), got
    assert any(NO_SUCH in line for line in got.last_output), got.last_output


def test_through_the_real_server_a_model_needing_an_engine_gets_it_installed_then_its_replica_starts(
        tmp_path: Path, index_url: str) -> None:
    """`llmgw server --engine-index URL --engine-find-links`: a model asking for sim 0.3.1, which node1 lacks, makes
    the control plane send a Provision; node1 installs it, reports it Ready, and the replica starts after, from
    the install's python."""
    engines_dir = tmp_path / "engines"
    with system_mod.running(tmp_path / "sys", server_args=["--engine-index", index_url, "--engine-find-links"],
                            agent_env={"LLMGW_AGENT_ENGINES_DIR": str(engines_dir),
                                       "LLMGW_AGENT_OWN_PYTHON_ENGINES": "false"}) as s:
        s.apply(system_mod.sim_model("talky", engine_version="0.3.1"))
        s.wait_model("talky", timeout=120)
        listing = s.get("/api/v1/engines")
        installs = [i for n in listing["nodes"] for i in n.get("installs", ())]
        assert any((i["engine"], i["version"], i["state"]) == ("sim", "0.3.1", "Ready") for i in installs), listing
        (replica,) = s.replicas("talky")
        port = int(replica["endpoint"].rsplit(":", 1)[1])
        (pid,) = {c.pid for c in psutil.net_connections(kind="tcp")
                  if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port}
        program = psutil.Process(pid).cmdline()[0]
        assert program == str(engines_dir / "sim-0.3.1-py" / "bin" / "python"), (program, replica)
