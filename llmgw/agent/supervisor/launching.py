"""Turning a shard spec into a running process: the only ``create_subprocess_exec`` in the agent.

Everything that can be checked is checked before a process exists, and every
refusal is an ``EngineError`` whose message says what to change: an engine
that refuses a bad profile does so minutes into loading, on a node nobody is
watching. Processes are started from an argv list, never a shell, in a new
session so that the child's process group id equals its pid and a stop can
signal the engine and every worker it forked without touching anything else.

Every engine carries ``LLMGW_SHARD_ID`` and ``LLMGW_RUN_DIR`` in its
environment, and so does every worker it forks: that is how an agent started
later recognises a process a previous one launched even when the state file
that describes it is gone (see ``recovering``).

GPUs are given, never taken: ``CUDA_VISIBLE_DEVICES`` is exactly the spec's
``gpus`` (with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, so that CUDA numbers GPUs as
NVML and nvidia-smi do, which is how the node reported them), and an engine
given none on a node that has GPUs gets an empty one: left unset, vLLM or a
CUDA build of llama.cpp takes GPU 0, which placement gave to another replica.
Neither the spec's env nor the agent's own can change that.

A shard that is one rank of a multi-node replica gets its rank the same way:
``LLMGW_NNODES``, ``LLMGW_RANK``, ``LLMGW_LEADER_ADDR`` and ``LLMGW_LEADER_PORT``
come from the spec's rank fields and override any the spec's env or the
agent's own set. The collectives' variables (``NCCL_SOCKET_IFNAME``,
``GLOO_SOCKET_IFNAME``, ``NCCL_IB_HCA``, ``NCCL_IB_GID_INDEX``) are the
adapter's, derived from this node's facts (``base.multinode_env``), and what it
derives wins over the spec's env and the agent's own too: a cluster-wide
interface name in a model file, or an NCCL_IB_HCA inherited from the agent,
would send a rank's traffic over the wrong interface or the adapters of
another fabric, and the first collective would hang. An adapter that derives
no NCCL_IB_HCA for a rank that was given adapters still gets the spec's.

Each shard gets a private work directory, ``<run_dir>/<shard_id>.d`` (mode
0700), for its engine's temporary files, sockets and caches: vLLM left its
IPC sockets and compile caches in the shared /tmp and home, where the next
replica on the node found them. The supervisor removes it once the process
is gone; nothing else under the run dir is ever removed for it.

No engine runs as root (``identity``): when the agent is root, each is started
as the user ``identity.Users`` gave its shard, with none of the agent's groups and
umask 077, its work dir (and what the adapter wrote there, SGLang's key file)
made its own, HOME, USER and LOGNAME naming it, and its log opened by the agent
(0600) and handed over as a descriptor: the engine never needs the run dir,
which is 0711 so that it can reach its work dir and list nothing. Before the
spawn, ``preflight`` checks that the engine's user can reach its
program, its arguments' paths and its model, and refuses the shard with the
directory that blocks it when it cannot.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import shutil
import socket
import sys
from pathlib import Path
from typing import BinaryIO

from llmgw.agent import engines, enginetls, privfile
from llmgw.agent.supervisor import asuser, identity, preflight
from llmgw.core import enginecheck, shards
from llmgw.core.errors import EngineError, ShardIdError
from llmgw.core.shards import ShardSpec

log = logging.getLogger(__name__)

#: The markers set in every engine's environment.
SHARD_ENV = "LLMGW_SHARD_ID"
RUN_DIR_ENV = "LLMGW_RUN_DIR"
#: The collectives' variables an adapter derives from the node's facts for a multi-node rank.
FABRIC_ENV = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_IB_HCA", "NCCL_IB_GID_INDEX")
WORK_DIR_SUFFIX = ".d"


@dataclasses.dataclass(frozen=True, slots=True)
class Plan:
    """What to run for one shard, and where it will answer."""

    argv: list[str]
    env: dict[str, str]
    endpoint: str
    health_path: str
    log_path: Path
    port: int = 0
    #: False for a worker rank that answers no HTTP: it is judged by staying alive, never probed.
    serves_http: bool = True
    #: The shard's private directory (``work_dir_of``); the launch makes it, the end of the process removes it.
    work_dir: Path | None = None
    #: Where the process runs (the adapter's ``Launch.cwd``); None: the agent's own directory.
    cwd: Path | None = None
    #: Who it runs as (``identity``); None: the agent's own user (an agent that is not root).
    user: identity.EngineUser | None = None
    #: The model file or directory the engine loads, checked by the preflight.
    model_path: str | None = None


def endpoint_of(host: str, port: int, *, tls: bool = False) -> str:
    """``http://HOST:PORT``, or ``https://`` for an engine serving TLS (``enginetls``)."""
    # An IPv6 literal needs brackets in a URL, or the port reads as part of it.
    scheme = "https" if tls else "http"
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


def free_port(host: str) -> int:
    """A port on ``host`` that was free a moment ago; the engine binds it next."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            return int(sock.getsockname()[1])
    except OSError as exc:
        raise EngineError(f"cannot bind a port on {host}: {exc.strerror}; the agent's engine host "
                          "must be an address of this machine") from exc


def gpu_env(spec: ShardSpec, node_gpus: tuple[int, ...] | None) -> dict[str, str]:
    """The CUDA variables for ``spec`` on a node with GPUs ``node_gpus`` (None: not known yet).

    EngineError when the spec names a GPU twice or one the node does not have:
    launched anyway, the engine would fail minutes later, or run on the wrong GPU.
    """
    if spec.gpus:
        twice = sorted({g for g in spec.gpus if spec.gpus.count(g) > 1})
        if twice:
            raise EngineError(f"shard {spec.shard_id}: GPU {', '.join(map(str, twice))} is listed twice in "
                              f"its gpus {list(spec.gpus)}; each GPU is given once")
        if node_gpus is not None:
            missing = [g for g in spec.gpus if g not in node_gpus]
            if missing:
                have = ", ".join(map(str, node_gpus)) if node_gpus else "none"
                raise EngineError(f"shard {spec.shard_id}: asks for GPU {', '.join(map(str, missing))}, which "
                                  f"this node does not have (its GPUs: {have}); the control plane must place "
                                  "it again from this node's inventory")
        return {"CUDA_VISIBLE_DEVICES": ",".join(map(str, spec.gpus)), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    if node_gpus:
        # Given no GPU on a node that has some: it must not grab one by accident.
        return {"CUDA_VISIBLE_DEVICES": ""}
    return {}


def group_env(spec: ShardSpec) -> dict[str, str]:
    """The rank variables of a shard that is one rank of a multi-node replica; nothing for one node."""
    if spec.nnodes <= 1:
        return {}
    if not 0 <= spec.rank < spec.nnodes:
        raise EngineError(f"shard {spec.shard_id}: rank {spec.rank} is not one of the {spec.nnodes} ranks "
                          f"0..{spec.nnodes - 1}; the control plane must place the replica again")
    if not spec.leader_addr or not 0 < spec.leader_port < 65536:
        raise EngineError(f"shard {spec.shard_id}: rank {spec.rank} of {spec.nnodes} has no leader address and "
                          f"port ({spec.leader_addr!r}:{spec.leader_port}); the control plane must send both")
    return {"LLMGW_NNODES": str(spec.nnodes), "LLMGW_RANK": str(spec.rank),
            "LLMGW_LEADER_ADDR": spec.leader_addr, "LLMGW_LEADER_PORT": str(spec.leader_port)}


def fabric_env(spec: ShardSpec, launch: engines.Launch) -> dict[str, str]:
    """The collectives' variables that must win over the spec's env and the agent's: what the adapter derived.

    A value the adapter passed on unchanged from the spec's env is the spec's,
    not derived. A rank of a multi-node replica whose adapter derives no
    NCCL_IB_HCA still gets the adapters placement gave it.
    """
    given = dict(spec.env)
    derived = {k: launch.env[k] for k in FABRIC_ENV if k in launch.env and given.get(k) != launch.env[k]}
    if spec.nnodes > 1 and spec.hcas and "NCCL_IB_HCA" not in derived:
        derived["NCCL_IB_HCA"] = ",".join(spec.hcas)
    overridden = sorted(k for k in derived if k in given and given[k] != derived[k])
    if overridden:
        log.warning("shard %s: its env sets %s, which llmgw derives from this node's facts; ignored",
                    spec.shard_id, ", ".join(overridden))
    return derived


def plan(spec: ShardSpec, adapter: engines.Adapter, *, host: str, model_path: str | None,
         cpu_count: int, run_dir: Path, node: enginecheck.NodeFacts | None = None,
         user: identity.EngineUser | None = None, tls: enginetls.Material | None = None,
         lora_paths: tuple[str, ...] = ()) -> Plan:
    """The argv, environment and endpoint for ``spec``, and its work dir made; EngineError when it cannot run.

    ``run_dir`` must be absolute: it is the marker a later agent compares.
    ``node`` is what discovery found on this node (None: not known yet); its
    GPU indices are checked against the spec's. ``user``: who the engine runs
    as (None: the agent's own user); its work dir is given to it. ``tls``: the
    node's engine key and certificate, copied into the work dir (0600, the
    engine's) for the engine to serve TLS with; the endpoint is then https. ``lora_paths``: the adapter
    files an engine that takes them at start is given (``lorafiles``).
    """
    try:
        # The shard id becomes a file name under run_dir; "../x" or "a/b" would
        # write the log, the work dir, and later the state file somewhere else entirely.
        shards.check_shard_id(spec.shard_id)
    except ShardIdError as exc:
        raise EngineError(str(exc)) from None
    gpus = gpu_env(spec, tuple(g.index for g in node.gpus) if node is not None else None)
    ranks = group_env(spec)
    port = spec.port or free_port(host)
    # Made before the adapter runs (SGLang's writes its key file there) and
    # removed again if it refuses: a refusal leaves nothing behind.
    work_dir = work_dir_of(run_dir, spec.shard_id)
    make_work_dir(work_dir)
    try:
        # Only given when there is TLS: an adapter written before it takes no tls argument.
        extra: dict[str, object] = {"tls": enginetls.place(work_dir, tls)} if tls is not None else {}
        if lora_paths:
            extra["lora_paths"] = lora_paths
        launch = adapter.launch(spec, host=host, port=port, model_path=model_path, cpu_count=cpu_count,
                                node=node or enginecheck.NodeFacts(), work_dir=str(work_dir), **extra)
        if not launch.argv:
            raise EngineError(f"engine {spec.engine!r} produced an empty command line")
        cwd = _cwd(launch.cwd, work_dir)
        if user is not None:
            # After the adapter wrote its files there: they are the engine's to read.
            identity.give_tree(work_dir, user)
            # The agent's own directory may be one the engine cannot enter (/root).
            cwd = cwd or work_dir
    except BaseException:
        remove_work_dir(work_dir)
        raise
    # The spec's env wins over the adapter's, which wins over the agent's own:
    # a model file that sets CUDA_LAUNCH_BLOCKING means it.
    env = {**os.environ, **launch.env, **dict(spec.env)}
    ignored = sorted(k for k, _ in spec.env if shards.env_refusal(k) is not None)
    if ignored:
        # The control plane refuses these at apply time; one from an older control plane (or a
        # model stored before the refusal) is put back to the agent's own below, and said so:
        # the agent runs as root, and a model's LD_PRELOAD would run as root on every node.
        log.warning("shard %s: its env sets %s, which a model may not set (llmgw's own, an engine's key, a "
                    "loader or interpreter variable, or one naming a file or code to load); ignored",
                    spec.shard_id, ", ".join(ignored))
        for key in ignored:  # back to the agent's own (the adapters pass the spec's env on, too)
            if key in os.environ:
                env[key] = os.environ[key]
            else:
                env.pop(key, None)
    # The markers and the GPUs go last: a spec that set LLMGW_RUN_DIR would hide
    # its engine from the next agent's sweep, and it would hold its GPUs
    # unreported; one that set CUDA_VISIBLE_DEVICES would use GPUs given to another.
    env |= {**fabric_env(spec, launch), **gpus, **ranks, SHARD_ENV: spec.shard_id,
            RUN_DIR_ENV: str(run_dir)}
    if user is not None:
        # Who it is, last too: a HOME from the spec or the agent's /root would be a home it cannot use.
        for key in identity.AGENT_ONLY_ENV:
            env.pop(key, None)
        env |= identity.identity_env(user, work_dir)
    return Plan(argv=list(launch.argv), env=env, endpoint=endpoint_of(host, port, tls=tls is not None),
                health_path=adapter.health_path, log_path=log_path_of(run_dir, spec.shard_id), port=port,
                serves_http=launch.serves_http, work_dir=work_dir, cwd=cwd, user=user, model_path=model_path)


def _cwd(asked: str, work_dir: Path) -> Path | None:
    """The adapter's directory to run in: "" for the agent's, else only the shard's own work dir.

    An engine runs where llmgw made a directory for it, or where the agent runs;
    an adapter naming any other place is a bug, refused before anything starts.
    """
    if not asked:
        return None
    if Path(asked) != work_dir:
        raise EngineError(f"the adapter asked to run the engine in {asked}, not its work dir {work_dir}")
    return work_dir


def work_dir_of(run_dir: Path, shard_id: str) -> Path:
    """``shard_id``'s private directory; ShardIdError for an id that would name one outside ``run_dir``."""
    return run_dir / f"{shards.check_shard_id(shard_id)}{WORK_DIR_SUFFIX}"


def make_work_dir(path: Path) -> None:
    """Create ``path`` with mode 0700, empty; EngineError, saying what to do, when it cannot be.

    One already there is a leftover of an earlier engine under the same id
    (an agent that crashed before it could remove it): its sockets and caches
    are not this engine's, so it is removed first. A symlink or a file there is
    not llmgw's, and is refused rather than followed or deleted.
    """
    try:
        make_run_dir(path.parent)
        if path.is_symlink() or (path.exists() and not path.is_dir()):
            raise EngineError(f"{path} exists and is not a directory llmgw made; remove it, then start "
                              "the shard again")
        if path.exists():
            log.info("removing %s, left by an earlier engine under the same shard id", path)
            shutil.rmtree(path)
        # 0700: the engine's IPC sockets and caches are its own, and the spec's
        # API key can end up in them. chmod too: the umask could take more.
        path.mkdir(mode=0o700)
        os.chmod(path, 0o700)
    except OSError as exc:
        raise EngineError(f"cannot make the shard's work directory {path}: {exc.strerror or exc}; check "
                          "the agent's run directory") from exc


def make_run_dir(path: Path) -> None:
    """The run dir, made 0711 when llmgw makes it: an engine of another user reaches its work dir through it
    and lists nothing (the state files and logs in it are 0600 besides)."""
    privfile.make_dir(path, 0o711)


def remove_work_dir(path: Path | None) -> None:
    """Remove a shard's work dir once its process is gone (blocking: a cache can be many files).

    Only the directory ``work_dir_of`` names is ever removed, and never
    through a symlink. A failure is logged and what is left stays: the shard
    has ended either way, and shard ids are never reused.
    """
    if path is None or path.is_symlink() or not path.is_dir():
        return
    if not path.name.endswith(WORK_DIR_SUFFIX):
        raise ValueError(f"{path} is not a shard's work dir")  # a caller's bug; nothing else is removed

    def failed(_func: object, failed_path: str, exc_info: tuple[type[BaseException], BaseException, object]) -> None:
        log.warning("cannot remove %s from a shard's work dir: %s", failed_path, exc_info[1])

    shutil.rmtree(path, onerror=failed)


def log_path_of(run_dir: Path, shard_id: str) -> Path:
    """Where ``shard_id``'s engine output goes; ShardIdError for an id that would name a file outside ``run_dir``."""
    return run_dir / f"{shards.check_shard_id(shard_id)}.log"


def _open_log(path: Path) -> tuple[BinaryIO, int]:
    make_run_dir(path.parent)
    # 0600 at creation: what an engine prints (prompts in a debug log, a path with a key) is not every user's.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
    log = os.fdopen(fd, "ab")  # closed by spawn once the child has it
    return log, log.seek(0, os.SEEK_END)


async def spawn(p: Plan) -> tuple[asyncio.subprocess.Process, int]:
    """Start the process with its output appended to its log; returns it and the log offset.

    Appending rather than truncating keeps what an earlier run under the same id
    wrote; the offset lets the failure report quote only this run's lines. An
    engine of another user is first checked (``preflight``, in a
    thread: a model directory can be many files), then started as that user.
    """
    if p.user is not None:
        await asyncio.to_thread(_preflight, p)
    try:
        log, offset = _open_log(p.log_path)
    except OSError as exc:
        raise EngineError(f"cannot write the engine's log {p.log_path}: {exc.strerror}; check the "
                          "agent's run directory") from exc
    # The child gets its own copy of the log's descriptor; ours is closed at
    # once, or the agent would leak one per shard it ever started.
    with log:
        try:
            proc = await asyncio.create_subprocess_exec(
                *_switched(p.user, p.argv), stdout=log, stderr=asyncio.subprocess.STDOUT,
                # No stdin: an engine that prompts would otherwise hang on the agent's terminal.
                stdin=asyncio.subprocess.DEVNULL, start_new_session=True, env=p.env, cwd=p.cwd,
                umask=0o077)
        except FileNotFoundError as exc:
            raise EngineError(f"cannot start {p.argv[0]}: it is not installed or not on PATH; "
                              "install the engine or set its path in the agent's configuration") from exc
        except OSError as exc:
            raise EngineError(f"cannot start {p.argv[0]}: {exc.strerror or exc}") from exc
    return proc, offset


def _preflight(p: Plan) -> None:
    assert p.user is not None
    preflight.preflight(p.user, p.argv, model_path=p.model_path, env=p.env, shard_id=p.env.get(SHARD_ENV, "?"),
                       work_dir=p.work_dir)


def _switched(user: identity.EngineUser | None, argv: list[str]) -> list[str]:
    """``argv`` run as ``user`` through ``asuser.py`` (groups, gid, uid dropped, then exec), or as it is.

    Not Popen's ``user=``/``group=``: those make CPython fork the agent instead of vforking, and a fork of a
    process full of gRPC threads closed the agent's stream now and then as an engine started (see asuser).
    """
    if user is None:
        return list(argv)
    return [sys.executable, "-I", "-S", str(Path(asuser.__file__)), str(user.uid), str(user.gid),
            ",".join(str(g) for g in user.groups), "--", *argv]
