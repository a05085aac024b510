"""Which environment variables a model's ``env`` may set: an allowlist per engine, and a rule no one lifts.

A model file is written by whoever may apply models (an operator), and its env reaches an engine process
on every node it is placed on. Issue 24 found that a denylist lets code through: ``OPENSSL_CONF`` naming a
downloaded config made the engine's ``import ssl`` dlopen a library, as root; ``OPENSSL_MODULES``,
``NCCL_NET_PLUGIN``, ``TRITON_PTXAS_PATH``, ``SSLKEYLOGFILE`` and ``HOME`` went through as well. So two tiers:

- **Never** (``hard_refusal``): what llmgw sets itself, every engine's API key variable, the loader's and
  interpreters' variables, and any variable that names a file, a directory or code to load (a name with a
  word such as PATH, DIR, FILE, HOME, ROOT, CONF, PLUGIN, LIB, MODULES, SO, PRELOAD, or ending ``_CACHE``).
  Not even an admin lifts these for a model: a node's own files are the node's matter, set in the agent's
  environment (its unit file), which every engine inherits. The agent drops them at launch too, so a
  model stored before this rule (or sent by an older control plane) cannot use one.
- **Allowed** (``refusal``): the knobs the engine documents, by prefix (``VLLM_``, ``NCCL_``, ...: the
  engine's record in ``llmgw.core.engines``), plus the exact names an admin adds to the cluster setting
  ``allowed_env``. Anything else is refused at apply, naming the rule and the command that lifts it.
  The agent does not know the cluster's settings, so this tier is checked at apply only.

Pure: the cluster's allowed names come in as an argument.
"""

from __future__ import annotations

import re

from llmgw.core import engines

#: Variables llmgw sets itself in every engine's environment. CUDA_VISIBLE_DEVICES comes from the
#: shard's GPUs (a model file that set it could put two replicas on the GPU placement gave to one);
#: CUDA_DEVICE_ORDER makes CUDA number GPUs as NVML does.
RESERVED = frozenset({"CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "LLMGW_SHARD_ID", "LLMGW_RUN_DIR"})

#: Variables that make a process load or run other code, whatever an engine's prefix.
LOADER_AND_INTERPRETER = frozenset({
    # glibc: tunables had a loader overflow (CVE-2023-4911); iconv modules and malloc hooks are code.
    "GLIBC_TUNABLES", "GCONV_PATH", "MALLOC_CHECK_", "LOCPATH", "NLSPATH",
    # Which binaries a subprocess finds (torch.compile runs a compiler, Triton runs ptxas).
    "PATH", "CC", "CXX",
    # Shells and interpreters an engine or its tools may start.
    "BASH_ENV", "ENV", "SHELLOPTS", "PS4", "IFS", "PERL5LIB", "PERL5OPT", "PERLLIB", "RUBYOPT", "RUBYLIB",
    "NODE_OPTIONS", "NODE_PATH", "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS",
    # Python's startup hooks: each imports or runs code named in the variable.
    "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "PYTHONINSPECT", "PYTHONBREAKPOINT",
    "PYTHONWARNINGS", "PYTHONPLATLIBDIR", "PYTHONEXECUTABLE", "PYTHONNOUSERSITE", "PYTHONSAFEPATH",
    "PYTHONPYCACHEPREFIX",
    # OpenSSL loads a config (which names engines and providers: shared objects), modules and engines;
    # SSLKEYLOGFILE writes every TLS secret to a file.
    "OPENSSL_CONF", "OPENSSL_MODULES", "OPENSSL_ENGINES", "SSLKEYLOGFILE",
    # Where a process keeps its caches and configs, read back as code (torch's compiled kernels, pickles).
    "HOME", "TMPDIR",
    # vLLM: a logging stream is an ``ext://module.attr`` to import; dev mode serves endpoints that call
    # engine internals (collective_rpc); insecure serialization takes pickles off its sockets.
    "VLLM_LOGGING_STREAM", "VLLM_SERVER_DEV_MODE", "VLLM_ALLOW_INSECURE_SERIALIZATION",
    # SGLang imports the package named here for its model classes.
    "SGLANG_EXTERNAL_MODEL_PACKAGE", "SGLANG_EXTERNAL_MM_MODEL_ARCH",
    # Paths by another name: torch's structured trace directory, the pipe CUDA writes core dumps to.
    "TORCH_TRACE", "CUDA_COREDUMP_PIPE",
    # Every user's prompts and completions written into the engine's log, which viewers read.
    "VLLM_DEBUG_LOG_API_SERVER_RESPONSE",
})
#: Words that make a name a credential (SGLANG_API_KEY, HF_TOKEN): llmgw sets the engines' keys itself,
#: and a secret in a model file is shown to every viewer of the model.
_SECRET_WORDS = frozenset({"KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIALS"})
_REFUSED_PREFIXES = ("LD_", "DYLD_", "LLMGW_")

#: Words (a name split at ``_``) that name a file, a directory or code to load.
_PATH_WORDS = frozenset({
    "PATH", "PATHS", "DIR", "DIRS", "DIRECTORY", "FOLDER", "FILE", "FILES", "FILENAME", "HOME", "ROOT",
    "CONF", "MODULES", "SO", "LIB", "LIBS", "LIBRARY", "PRELOAD", "INSECURE", "EXECUTABLE", "PACKAGE",
    "INJECTION64", "TRUST",
})
#: Words ending so are paths too (PYTHONPATH, TMPDIR, SSLKEYLOGFILE); PROFILE is not a file.
_PATH_ENDINGS = ("PATH", "DIR", "FILE")
#: Names with such a word whose value is a plain setting, not a path (each checked in its library).
PLAIN_VALUES = frozenset({
    "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF",  # "expandable_segments:True"
    "VLLM_V0_USE_OUTLINES_CACHE", "VLLM_V1_USE_OUTLINES_CACHE",  # booleans
    # Names installed entry points to load (a subset of what loads anyway): it can only narrow them.
    "VLLM_PLUGINS",
})

#: A model's ``env`` key must look like this (and an admin's ``allowed_env`` name too).
NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: What a node's admin does instead, for a variable no model may set.
NODE_HINT = ("a node's own files and libraries are set in the agent's environment (its unit file), "
             "which every engine inherits")


#: Set by the adapters or implied by how llmgw runs engines: offline, on the weights the agent fetched
#: (``spec.source``, where sources are checked). An engine sent online could fetch from any endpoint
#: the model file names, from inside the node's network.
OFFLINE = frozenset({"HF_HUB_OFFLINE", "HF_ENDPOINT", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"})


def _key_variables() -> frozenset[str]:
    return frozenset(e.api_key_env for e in engines.ENGINES.values() if e.api_key_env)


def names_code_or_path(name: str) -> str | None:
    """The word in ``name`` that makes it name a file, a directory or code (``"PLUGIN"``); None if none does."""
    upper = name.upper()
    if upper in PLAIN_VALUES:
        return None
    for word in filter(None, upper.split("_")):
        if word in _PATH_WORDS or "PLUGIN" in word or word.startswith("LIB"):
            return word
        if word.endswith(_PATH_ENDINGS) and not word.endswith("PROFILE"):
            return word
    if upper.endswith("_CACHE"):  # HF_HUB_CACHE, TRANSFORMERS_CACHE, LLAMA_CACHE: directories
        return "CACHE"
    return None


def hard_refusal(name: str) -> str | None:
    """Why no model may set ``name``, not even with an admin's leave; None when the allowlist decides.

    One clause naming what to do instead; the caller prefixes the field.
    """
    upper = name.upper()
    if name in RESERVED:
        return f"{name} is set by llmgw itself"
    if name in _key_variables():
        return f"{name} carries an engine's API key, which llmgw sets itself (the routers hold it)"
    if upper in OFFLINE:
        return (f"{name} is llmgw's: engines run offline on the weights the agent fetched; name them in "
                "spec.source, where the agent fetches and checks them")
    secret = next((w for w in upper.split("_") if w in _SECRET_WORDS), None)
    if secret is not None:
        return (f"{name} holds a credential ({secret}): a model's env is shown to every viewer, and engines' "
                "keys are llmgw's own; set a node's credentials in the agent's environment instead")
    if upper.startswith("LLAMA_ARG_"):
        return (f"{name} sets a llama.cpp flag; give it in spec.engine_args instead, where llmgw checks it")
    if upper in LOADER_AND_INTERPRETER or upper.startswith(_REFUSED_PREFIXES):
        return (f"{name} would make the engine load or run other code, on every node the model is placed on; "
                f"install what the engine needs into its environment instead ({NODE_HINT})")
    word = names_code_or_path(name)
    if word is not None:
        return (f"{name} names a file, a directory or code for the engine to load ({word}), which a model may "
                f"not set: the engine would load it on every node the model is placed on ({NODE_HINT})")
    return None


def allowed_by_engine(engine: str, name: str) -> bool:
    """Whether ``name`` is one of the knobs ``engine`` documents (its record's prefixes and names)."""
    rec = engines.record(engine)
    return rec is not None and (name in rec.env_names or name.startswith(rec.env_prefixes))


def takes(engine: str) -> str:
    """``VLLM_*, NCCL_*, ...``: what ``engine``'s env allowlist is, for a refusal."""
    rec = engines.record(engine)
    if rec is None:
        return "nothing"
    said = [f"{p}*" for p in rec.env_prefixes] + sorted(rec.env_names)
    return ", ".join(said) if said else "nothing"


def refusal(engine: str, name: str, *, allowed_env: frozenset[str] = frozenset()) -> str | None:
    """Why a model of ``engine`` may not set ``name`` given the admin's ``allowed_env``; None when it may."""
    hard = hard_refusal(name)
    if hard is not None:
        return f"{hard}; remove it from env"
    if name in allowed_env or allowed_by_engine(engine, name):
        return None
    return (f"not an engine setting llmgw allows ({engine} takes {takes(engine)}); an admin may allow it "
            f"with `llmgw settings set allowed_env+={name}`")


def allowed_env_refusal(name: str) -> str | None:
    """Why an admin may not add ``name`` to ``allowed_env``; None when they may."""
    if not isinstance(name, str) or not NAME_RE.match(name):
        return f"{name!r} is not an environment variable name (letters, digits and _, not starting with a digit)"
    return hard_refusal(name)
