"""Engine wants: each node's Provision from node, pool and model wants; removals' users; the install sentences."""

from __future__ import annotations

import dataclasses

from test_placement_data import node, rep, spec

from llmgw.control.placement import fit
from llmgw.control.reconcile import engines as prov
from llmgw.control.state import NodeView, Phase
from llmgw.core.provision import EngineInstall, EngineWant, InstallState

SETTINGS = prov.EngineSettings(index_url="http://127.0.0.1:9/simple")


def installing(n: NodeView, *installs: EngineInstall) -> NodeView:
    return dataclasses.replace(n, inventory=dataclasses.replace(n.inventory, installs=installs))


def inst(engine: str, version: str, state: InstallState, **kw: object) -> EngineInstall:
    return EngineInstall(engine, version, "cpu", state, **kw)  # type: ignore[arg-type]


def test_node_and_pool_wants_reach_only_their_nodes() -> None:
    """A node gets its own wants and its pool's; another pool's and another node's are not its."""
    wants = [prov.ScopedWant("node:a", "vllm", "0.11.2"), prov.ScopedWant("pool:gpu", "sglang", "0.5.1"),
             prov.ScopedWant("pool:cpu", "llamacpp", "0.2.0"), prov.ScopedWant("node:b", "sim", "0.1")]
    a = node("a", labels={"pool": "gpu"})
    got = prov.provision_for(a, wants, {}, SETTINGS)
    assert got.wants == (EngineWant("sglang", "0.5.1"), EngineWant("vllm", "0.11.2"))
    assert got.index_url == SETTINGS.index_url and not got.find_links and not got.remove
    assert prov.provision_for(node("c"), wants, {}, SETTINGS).wants == ()


def test_a_model_asks_for_its_engine_version_where_it_may_run_and_nothing_has_it() -> None:
    """A model's engine_version is wanted on nodes its pool takes and that lack it; not where it runs already."""
    models = {"m": spec(engine="vllm", version="0.11.2", pool="gpu"), "any": spec(engine="vllm")}
    lacks = node("a", labels={"pool": "gpu"})
    has = node("b", labels={"pool": "gpu"}, engines=("vllm",), versions={"vllm": "0.11.2"})
    elsewhere = node("c", labels={"pool": "cpu"})
    assert prov.provision_for(lacks, [], models, SETTINGS).wants == (EngineWant("vllm", "0.11.2"),)
    assert prov.provision_for(has, [], models, SETTINGS).wants == ()
    assert prov.provision_for(elsewhere, [], models, SETTINGS).wants == ()
    off = dataclasses.replace(SETTINGS, models_trigger_installs=False)
    assert prov.provision_for(lacks, [], models, off).wants == ()


def test_a_model_want_stays_while_its_install_is_under_way_and_goes_once_ready() -> None:
    """An Installing or Failed install keeps the model's want (no flapping); a Ready one satisfies it."""
    models = {"m": spec(engine="vllm", version="0.11")}
    want = (EngineWant("vllm", "0.11"),)
    for state in (InstallState.Installing, InstallState.Failed):
        n = installing(node("a"), inst("vllm", "0.11", state))
        assert prov.provision_for(n, [], models, SETTINGS).wants == want, state
    ready = installing(node("a"), inst("vllm", "0.11.2", InstallState.Ready))
    assert prov.provision_for(ready, [], models, SETTINGS).wants == ()


def test_settings_round_trip_through_the_store_map() -> None:
    """The settings survive to_map/from_map; an empty map is the defaults (models trigger installs)."""
    s = prov.EngineSettings(index_url="http://x/simple", find_links=True, models_trigger_installs=False,
                            os_packages=True)
    assert prov.EngineSettings.from_map(s.to_map()) == s
    assert prov.EngineSettings.from_map({}) == prov.EngineSettings()
    assert prov.EngineSettings().models_trigger_installs


def test_users_of_a_version_are_the_replicas_on_those_nodes_that_may_run_it() -> None:
    """A replica counts if its model's engine matches and its engine_version takes the version (or names none)."""
    models = {"pinned": spec(engine="vllm", version="0.11"), "loose": spec(engine="vllm"),
              "other": spec(engine="vllm", version="0.12"), "sim": spec()}
    reps = [rep("p1", "a", Phase.READY, "pinned"), rep("l1", "a", Phase.STARTING, "loose"),
            rep("o1", "a", Phase.READY, "other"), rep("s1", "a", Phase.READY, "sim"),
            rep("p2", "b", Phase.READY, "pinned")]
    assert prov.users_of(EngineWant("vllm", "0.11.2"), ["a"], reps, models) == ["l1", "p1"]
    assert prov.users_of(EngineWant("vllm", "0.11.2"), ["c"], reps, models) == []


def test_a_replica_waiting_for_an_install_says_the_install_sentence() -> None:
    """A node installing the engine leads the refusal with its progress; one that failed says pip's words."""
    s = spec(engine="vllm", version="0.11.2")
    busy = installing(node("a"), inst("vllm", "0.11.2", InstallState.Installing, message="downloading",
                                      bytes_done=1_200_000_000, bytes_total=3_400_000_000))
    out = fit.place("m", s, [node("b"), busy], fit.Ledger((), {"m": s}))
    assert isinstance(out, fit.Refused)
    assert out.message == ("no node can run a replica of m: no node has vllm 0.11.2 installed yet; "
                           "Installing vllm 0.11.2 on a: downloading 1.2/3.4 GB; b lacks engine vllm (has: llamacpp, "
                           "sim)")
    failed = installing(node("a"), inst("vllm", "0.11.2", InstallState.Failed,
                                        message="No matching distribution found for vllm==0.11.2"))
    out = fit.place("m", s, [failed], fit.Ledger((), {"m": s}))
    assert isinstance(out, fit.Refused)
    assert "Failed: vllm 0.11.2 on a: No matching distribution found for vllm==0.11.2" in out.message


def test_an_install_on_a_node_the_model_may_not_use_is_not_named() -> None:
    """A node of another pool installing the engine reads as lacking it: it would not take the replica anyway."""
    s = spec(engine="vllm", version="0.11.2", pool="gpu")
    n = installing(node("a", labels={"pool": "cpu"}), inst("vllm", "0.11.2", InstallState.Installing))
    out = fit.place("m", s, [n], fit.Ledger((), {"m": s}))
    assert isinstance(out, fit.Refused)
    assert out.reasons == {"a": "lacks engine vllm (has: llamacpp, sim)"}


def test_provisions_for_many_nodes_are_each_nodes_own() -> None:
    """The indexed pass gives each node what provision_for does, even nodes alike in labels but not in installs."""
    models = {"pinned": spec(engine="vllm", version="0.11", pool="gpu"), "any": spec(engine="vllm", version="0.12"),
              "loose": spec()}
    nodes = [node("a", labels={"pool": "gpu"}),
             installing(node("b", labels={"pool": "gpu"}), inst("vllm", "0.11.1", InstallState.Ready)),
             node("c", labels={"pool": "gpu"}, engines=("vllm",), versions={"vllm": "0.12.3"}),
             node("d", labels={"pool": "cpu"}), node("e")]
    wants = [prov.ScopedWant("pool:cpu", "sim", "0.2"), prov.ScopedWant("node:e", "llamacpp", "0.3")]
    got = prov.provisions(nodes, wants, models, SETTINGS)
    assert got == {n.id: prov.provision_for(n, wants, models, SETTINGS) for n in nodes}
    assert got["a"].wants == (EngineWant("vllm", "0.11"), EngineWant("vllm", "0.12"))
    assert got["b"].wants == (EngineWant("vllm", "0.12"),)
    assert got["c"].wants == (EngineWant("vllm", "0.11"),)
    assert got["d"].wants == (EngineWant("sim", "0.2"), EngineWant("vllm", "0.12"))
    assert got["e"].wants == (EngineWant("llamacpp", "0.3"), EngineWant("vllm", "0.12"))
    off = dataclasses.replace(SETTINGS, models_trigger_installs=False)
    assert prov.provisions(nodes, wants, models, off)["a"].wants == ()


def test_an_install_coming_to_rest_is_an_event_its_progress_is_not() -> None:
    """Ready is a Normal event, Failed and Unsupported Warnings with their sentence; Installing and repeats none."""
    before = (inst("vllm", "0.11.2", InstallState.Installing), inst("sim", "0.1", InstallState.Ready))
    after = (inst("vllm", "0.11.2", InstallState.Failed, message="pip said no"), inst("sim", "0.1", InstallState.Ready),
             inst("sglang", "0.5.1", InstallState.Unsupported, message="needs avx512f"),
             inst("llamacpp", "0.2.0", InstallState.Installing))
    got = [(e.kind, e.reason, e.object, e.message) for e in prov.install_events("a", before, after, now=1.0)]
    assert got == [("Warning", "EngineInstallFailed", "node/a", "Failed: vllm 0.11.2 on a: pip said no"),
                   ("Warning", "EngineInstallUnsupported", "node/a", "Unsupported: sglang 0.5.1 on a: needs avx512f")]
    ready = prov.install_events("a", after, (inst("vllm", "0.11.2", InstallState.Ready),), now=2.0)
    assert [(e.kind, e.reason, e.message) for e in ready] == [("Normal", "EngineInstallReady",
                                                               "vllm 0.11.2 on a is installed")]
