"""Engine TLS, agent and control plane sides, on plain data and real files: the setting, the engine key and
certificate (modes, owner, checks), each engine's argv checked against its recorded parser, the stream's
purpose routing, and what the control plane signs."""

from __future__ import annotations

import asyncio
import datetime
import os
import socket
import ssl
import stat
import sys
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from llmgw.agent import config, enginetls, nodepki, settingsload
from llmgw.agent.engines import base, llamacpp, llamacpp_launcher, sglang, sim, vllm
from llmgw.agent.session.enginecert import EngineCertRenewal
from llmgw.agent.session.heartbeats import Renewal
from llmgw.agent.session.outbox import Outbox
from llmgw.agent.supervisor import identity, launching
from llmgw.api.v1 import agent_pb2 as pb
from llmgw.control.agentsvc import join
from llmgw.core import pki, shards
from llmgw.core.errors import EngineError, LlmgwError
from llmgw.sim.engine import cli as sim_cli
from llmgw.testing import argcheck

CA = pki.create_ca()
NODE = "gpu-node-7"
FILES = base.TlsFiles(key="/run/llmgw/s1.d/engine.key", cert="/run/llmgw/s1.d/engine.crt")


def _pki(tmp_path: Path, node: str = NODE) -> nodepki.NodePki:
    key = pki.new_key()
    return nodepki.write(tmp_path, ca_pem=CA.cert_pem, cert_pem=pki.sign_csr(CA, pki.create_csr(node, key), node),
                         key_pem=pki.key_pem(key), servers=["cp:8081"], node_id=node)


def _engine_tls(tmp_path: Path, mode: str = "on") -> enginetls.EngineTls:
    return enginetls.EngineTls(mode=mode, pki_dir=_pki(tmp_path).dir, node_id=NODE, wait_s=0.2)


# --- the setting -------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("mode", "host", "tls"), [
    ("auto", "127.0.0.1", False), ("auto", "::1", False), ("auto", "localhost", False),
    ("auto", "10.0.0.5", True), ("auto", "fd00::5", True),
    ("on", "127.0.0.1", True), ("off", "10.0.0.5", False),
])
def test_engine_tls_setting_decides_by_the_listen_address(mode: str, host: str, tls: bool) -> None:
    """auto: TLS beyond loopback only; on: always; off: never."""
    assert enginetls.wanted(mode, host) is tls


def test_engine_tls_is_read_from_file_env_and_flag_and_a_bad_value_is_refused(tmp_path: Path) -> None:
    """Default auto; the file, LLMGW_AGENT_ENGINE_TLS and --engine-tls set it (a flag wins); 'maybe' is refused
    naming the field."""
    path = tmp_path / "agent.yaml"
    path.write_text("server: cp1\nengine_tls: off\n")
    base_env = {"HOME": "/home/u"}
    assert settingsload.load(path=None, env={**base_env, "LLMGW_AGENT_SERVER": "cp1"}, flags={}).engine_tls == "auto"
    assert settingsload.load(path=path, env=base_env, flags={}).engine_tls == "off"
    assert settingsload.load(path=path, env={**base_env, "LLMGW_AGENT_ENGINE_TLS": "on"}, flags={}).engine_tls == "on"
    assert settingsload.load(path=path, env={**base_env, "LLMGW_AGENT_ENGINE_TLS": "on"},
                             flags={"engine_tls": "auto"}).engine_tls == "auto"
    path.write_text("server: cp1\nengine_tls: maybe\n")
    with pytest.raises(LlmgwError, match="engine_tls"):
        settingsload.load(path=path, env=base_env, flags={})


def test_engine_tls_on_without_certificates_is_refused_naming_the_setting(tmp_path: Path) -> None:
    """An --insecure agent has no CA to get an engine certificate from: on is refused saying what to do."""
    st = settingsload.load(path=None, env={"HOME": "/home/u"}, flags={
        "servers": ["127.0.0.1:8081"], "insecure": True, "engine_tls": "on", "state_dir": tmp_path,
        "mgmt_addr": "127.0.0.1"})
    with pytest.raises(LlmgwError, match="engine_tls is on.*set engine_tls to off"):
        config.from_settings(st)


# --- the key and certificate on disk ------------------------------------------------------------------------

def test_the_engine_key_is_its_own_0600_and_not_the_nodes(tmp_path: Path) -> None:
    """engine.key is made in pki/ at first use, 0600, another key than node.key; its CSR names the node."""
    tls = _engine_tls(tmp_path)
    csr = x509.load_pem_x509_csr(tls.csr())
    assert stat.S_IMODE(os.stat(tls.key_path).st_mode) == 0o600
    node_key = nodepki.NodePki(tls.key_path.parent).private_key()
    assert csr.public_key().public_numbers() != node_key.public_key().public_numbers()
    assert csr.public_key().public_numbers() == tls.private_key().public_key().public_numbers()
    assert tls.key_path.read_bytes() == tls.key_path.read_bytes()  # made once, kept


def test_the_certificate_is_taken_only_when_it_is_this_nodes_engine_certificate_for_the_engine_key(
        tmp_path: Path) -> None:
    """Due with none; a node certificate, another node's engine certificate, or one for another key is refused;
    the right one is stored 0600 and no longer due until the last third of its life."""
    tls = _engine_tls(tmp_path)
    assert tls.due()
    with pytest.raises(LlmgwError, match="not node gpu-node-7's engine certificate"):
        tls.store(pki.sign_csr(CA, tls.csr(), NODE))  # a node (client) certificate for the engine key
    with pytest.raises(LlmgwError, match="not node gpu-node-7's engine certificate"):
        tls.store(pki.sign_engine_csr(CA, tls.csr(), "other-node"))
    with pytest.raises(LlmgwError, match="not for this node's engine key"):
        tls.store(pki.sign_engine_csr(CA, pki.create_csr(NODE, pki.new_key()), NODE))
    assert tls.cert_pem() is None
    now = datetime.datetime.now(datetime.UTC)
    tls.store(pki.sign_engine_csr(CA, tls.csr(), NODE, now=now, validity=datetime.timedelta(days=30)))
    assert stat.S_IMODE(os.stat(tls.cert_path).st_mode) == 0o600
    assert not tls.due(now=now + datetime.timedelta(days=19))
    assert tls.due(now=now + datetime.timedelta(days=21))  # past 2/3 of its life


def test_a_start_waits_for_the_certificate_and_is_refused_with_the_reason_when_none_comes(tmp_path: Path) -> None:
    """material() returns the key and certificate once stored; without one it says why, naming engine_tls."""
    tls = _engine_tls(tmp_path)

    async def run() -> None:
        tls.refuse("this control plane runs with --insecure")
        with pytest.raises(EngineError, match="no engine certificate.*--insecure.*engine_tls to off"):
            await tls.material()
        waiting = asyncio.create_task(tls.material())
        await asyncio.sleep(0.01)
        tls.store(pki.sign_engine_csr(CA, tls.csr(), NODE))
        got = await waiting
        assert got.key_pem == tls.key_path.read_bytes() and got.cert_pem == tls.cert_pem()

    asyncio.run(run())
    assert not enginetls.EngineTls(mode="auto", pki_dir=None, node_id=NODE).wanted("10.0.0.5")  # --insecure: plain
    off = enginetls.EngineTls(mode="on", pki_dir=None, node_id=NODE)
    with pytest.raises(EngineError, match="no certificates.*engine_tls to off"):
        asyncio.run(off.material())


def test_each_engine_gets_its_own_0600_copy_owned_by_its_user(tmp_path: Path) -> None:
    """The plan writes engine.key/engine.crt into the shard's work dir, 0600, owned by the engine's uid, hands
    the adapter their paths, and the endpoint is https; the work dir's removal takes them."""
    if os.geteuid() != 0:
        pytest.fail("this test chowns to an engine uid: run it as root (the agent's own case)")
    tls = _engine_tls(tmp_path / "state")
    tls.store(pki.sign_engine_csr(CA, tls.csr(), NODE))
    material = enginetls.Material(key_pem=tls.key_path.read_bytes(), cert_pem=tls.cert_pem() or b"")
    given: dict[str, Any] = {}

    class Adapter:
        name, health_path = "sim", "/health"

        def launch(self, spec: shards.ShardSpec, **kw: Any) -> base.Launch:
            given.update(kw)
            return base.Launch(argv=[sys.executable, "-c", "pass"], env={})

    user = identity.EngineUser(600123, 600123, "llmgw-shard-600123")
    spec = shards.ShardSpec(shard_id="s1", replica_id="r1", model="m", engine="sim", served_name="m", port=8443)
    run_dir = tmp_path / "shards"
    plan = launching.plan(spec, Adapter(), host="127.0.0.1", model_path=None, cpu_count=2, run_dir=run_dir,
                          user=user, tls=material)
    assert plan.endpoint == "https://127.0.0.1:8443"
    files = given["tls"]
    assert (Path(files.key).parent, Path(files.cert).parent) == (plan.work_dir, plan.work_dir)
    for path, data in ((files.key, material.key_pem), (files.cert, material.cert_pem)):
        st = os.stat(path)
        assert stat.S_IMODE(st.st_mode) == 0o600 and (st.st_uid, st.st_gid) == (600123, 600123)
        assert Path(path).read_bytes() == data
    launching.remove_work_dir(plan.work_dir)
    assert not Path(files.key).exists()
    given.clear()
    plain = launching.plan(spec, Adapter(), host="127.0.0.1", model_path=None, cpu_count=2, run_dir=run_dir)
    assert plain.endpoint == "http://127.0.0.1:8443" and "tls" not in given
    assert not (plain.work_dir / enginetls.KEY_FILE).exists() if plain.work_dir else False
    assert launching.endpoint_of("fd00::5", 9, tls=True) == "https://[fd00::5]:9"


# --- argv per engine ---------------------------------------------------------------------------------------

def _spec(engine: str, **kw: Any) -> shards.ShardSpec:
    return shards.ShardSpec(shard_id="s1", replica_id="r1", model="m", engine=engine, served_name="m",
                            source="file:///models/m", api_key="sk-1", **kw)


def test_vllm_serves_tls_with_its_ssl_flags_as_its_parser_reads_them() -> None:
    got = vllm.Vllm(python="/py").launch(_spec("vllm"), host="10.0.0.5", port=8000, model_path="/models/m",
                                         cpu_count=4, work_dir="/run/llmgw/s1.d", tls=FILES)
    args = argcheck.parse_with_fixture("vllm-0.32.0", got.argv[3:])
    assert (args["ssl_keyfile"], args["ssl_certfile"]) == (FILES.key, FILES.cert)
    plain = vllm.Vllm(python="/py").launch(_spec("vllm"), host="10.0.0.5", port=8000, model_path="/models/m",
                                           cpu_count=4, work_dir="/run/llmgw/s1.d")
    assert argcheck.parse_with_fixture("vllm-0.32.0", plain.argv[3:])["ssl_keyfile"] is None


def test_sglang_serves_tls_with_its_ssl_flags_as_its_parser_reads_them(tmp_path: Path) -> None:
    got = sglang.Sglang(python="/py").launch(_spec("sglang"), host="10.0.0.5", port=30000, model_path="/models/m",
                                             cpu_count=4, work_dir=str(tmp_path), tls=FILES)
    args = argcheck.parse_with_fixture("sglang-0.5.23", got.argv[3:])
    assert (args["ssl_keyfile"], args["ssl_certfile"]) == (FILES.key, FILES.cert)


def test_llamacpp_and_its_launcher_take_llama_servers_ssl_flags() -> None:
    """llama-server's own --ssl-key-file/--ssl-cert-file, which the xllamacpp launcher parses too."""
    adapter = llamacpp.LlamaCpp(which=lambda _: None, python="/py")
    got = adapter.launch(_spec("llamacpp"), host="10.0.0.5", port=8080, model_path="/m.gguf", cpu_count=4, tls=FILES)
    assert got.argv[:2] == ["/py", llamacpp.launcher_file()]
    args = llamacpp_launcher.parse_args(got.argv[2:])
    assert (args.ssl_key_file, args.ssl_cert_file) == (FILES.key, FILES.cert)
    binary = llamacpp.LlamaCpp(which=lambda _: "/usr/bin/llama-server").launch(
        _spec("llamacpp"), host="10.0.0.5", port=8080, model_path="/m.gguf", cpu_count=4, tls=FILES)
    assert binary.argv[binary.argv.index("--ssl-key-file") + 1] == FILES.key
    assert binary.argv[binary.argv.index("--ssl-cert-file") + 1] == FILES.cert
    with pytest.raises(SystemExit):
        llamacpp_launcher.parse_args(["--model", "m.gguf", "--ssl-key-file", "k"])  # the certificate too


def test_sim_takes_vllms_ssl_flags() -> None:
    got = sim.Sim(python="/py").launch(_spec("sim"), host="10.0.0.5", port=8000, model_path=None, cpu_count=1,
                                       tls=FILES)
    args = sim_cli.parse_args(got.argv[3:])
    assert (args.ssl_keyfile, args.ssl_certfile) == (FILES.key, FILES.cert)
    with pytest.raises(SystemExit):
        sim_cli.parse_args(["--model", "m", "--ssl-certfile", "c"])


@pytest.mark.parametrize(("engine", "flag"), [("vllm", "--ssl-keyfile"), ("sglang", "--ssl-certfile"),
                                              ("sim", "--ssl-keyfile"), ("llamacpp", "--ssl-cert-file")])
def test_a_models_engine_args_cannot_set_the_tls_flags(engine: str, flag: str) -> None:
    """llmgw sets them: a model file's args naming them is refused as a reserved flag."""
    assert base.reserved_in(engine, [flag, "/tmp/x"]) == [flag]


# --- the stream --------------------------------------------------------------------------------------------

def test_engine_requests_carry_the_purpose_and_answers_go_to_their_renewal(tmp_path: Path) -> None:
    """At registration an ENGINE RenewCert goes out with a CSR of the engine key (once until answered); an
    ENGINE CertIssued is stored; the node's renewal refuses a certificate that is not for the node key."""
    tls = _engine_tls(tmp_path)
    outbox = Outbox()
    outbox.queue = asyncio.Queue()
    renewal = EngineCertRenewal(tls)
    renewal.ask_if_due(outbox)
    renewal.ask_if_due(outbox)
    assert outbox.queue.qsize() == 1
    sent = outbox.queue.get_nowait()
    assert sent.renew_cert.purpose == pb.CERT_PURPOSE_ENGINE
    csr = x509.load_pem_x509_csr(sent.renew_cert.csr_pem)
    assert csr.public_key().public_numbers() == tls.private_key().public_key().public_numbers()
    cert = join.engine_cert(CA, node_id=NODE, csr_pem=sent.renew_cert.csr_pem,
                            validity_s=3600, now=datetime.datetime.now(datetime.UTC).timestamp())
    renewal.issued(pb.CertIssued(cert_pem=cert, purpose=pb.CERT_PURPOSE_ENGINE))
    assert tls.cert_pem() == cert and not renewal.asking and not tls.due()
    # An old control plane answers an engine request as a node one: the node's renewal must not take it.
    node = nodepki.NodePki(tls.key_path.parent)
    before = node.cert.read_bytes()
    Renewal(NODE, node).issued(pb.CertIssued(cert_pem=pki.sign_csr(CA, tls.csr(), NODE)))
    assert node.cert.read_bytes() == before


def test_the_control_plane_signs_an_engine_certificate_for_the_streams_node_whatever_the_csr_says() -> None:
    """CN = the stream's node, OU llmgw-engine, server auth only, no SAN; garbage is a PkiError."""
    now = datetime.datetime.now(datetime.UTC).timestamp()
    pem = join.engine_cert(CA, node_id=NODE, csr_pem=pki.create_csr("control-plane", pki.new_key()),
                           validity_s=3600, now=now)
    cert = pki.load_cert(pem)
    assert pki.engine_node(cert) == NODE
    assert list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
        ExtendedKeyUsageOID.SERVER_AUTH]
    assert pki.subject_alt_names(pem) == []
    with pytest.raises(pki.PkiError, match="not a PEM certificate request"):
        join.engine_cert(CA, node_id=NODE, csr_pem=b"junk", validity_s=3600, now=now)


def test_the_agents_client_context_accepts_only_this_nodes_engine_certificate(tmp_path: Path) -> None:
    """Over real TLS on loopback: this node's engine certificate passes the handshake; another node's, a node
    (client) certificate and the control plane's certificate of the same CA, and an engine certificate of
    another CA fail it, saying why."""
    key = pki.new_key()
    other_ca = pki.create_ca()
    certs = {"mine": pki.sign_engine_csr(CA, pki.create_csr(NODE, key), NODE),
             "other node": pki.sign_engine_csr(CA, pki.create_csr("n2", key), "n2"),
             "node cert": pki.sign_csr(CA, pki.create_csr(NODE, key), NODE),
             "other CA": pki.sign_engine_csr(other_ca, pki.create_csr(NODE, key), NODE)}
    api = pki.server_cert(CA, ["127.0.0.1"])  # the control plane's: server auth, same CA, not an engine's
    client = enginetls.client_context(CA.cert_pem, NODE)

    async def handshake(cert_pem: bytes, key_pem: bytes = pki.key_pem(key)) -> str | None:
        (tmp_path / "c.pem").write_bytes(cert_pem)
        (tmp_path / "k.pem").write_bytes(key_pem)
        server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_ctx.load_cert_chain(tmp_path / "c.pem", tmp_path / "k.pem")

        async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            w.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=server_ctx)
        port = server.sockets[0].getsockname()[1]
        def blocking() -> str | None:  # the same check on a blocking socket (urllib, httpx's sync client)
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, client.wrap_socket(raw):
                    return None
            except ssl.SSLError as e:
                return str(e)

        try:
            sync_said = await asyncio.to_thread(blocking)
            try:
                _, w = await asyncio.open_connection("127.0.0.1", port, ssl=client, server_hostname="")
                w.close()
                said = None
            except ssl.SSLError as e:
                said = str(e)
            assert (said is None) == (sync_said is None), (said, sync_said)
            return said
        finally:
            server.close()

    got = {name: asyncio.run(handshake(pem)) for name, pem in certs.items()}
    assert got["mine"] is None
    assert "node 'n2'" in (got["other node"] or "")
    assert "unsuitable certificate purpose" in (got["node cert"] or "")  # client auth only
    assert "not an llmgw engine certificate" in (asyncio.run(handshake(api.cert_pem, api.key_pem)) or "")
    assert "certificate verify failed" in (got["other CA"] or "")
