"""Generates the protobuf/gRPC modules under ``llmgw/api/v1`` from ``proto/``.

``python -m llmgw.api.codegen`` rewrites them; ``--check`` only compares and exits
non-zero when the committed files are stale, which is what the test suite runs.

protoc names the generated import after the proto's path (``llmgw.v1``), which is
not where the modules live in this package, so the import is rewritten to
``llmgw.api.v1``. Without that the stubs import a module that does not exist.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROTO_DIR = ROOT / "proto"
OUT_DIR = ROOT / "llmgw" / "api" / "v1"
PROTOS = ["llmgw/v1/agent.proto"]
SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def generate() -> dict[str, str]:
    """Runs protoc and returns {file name: text} of what it generated."""
    from grpc_tools import protoc  # a test/dev dependency, not needed at run time

    with tempfile.TemporaryDirectory() as tmp:
        args = ["protoc", f"-I{PROTO_DIR}", f"--python_out={tmp}", f"--pyi_out={tmp}",
                f"--grpc_python_out={tmp}", *PROTOS]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed; see its message above")
        out: dict[str, str] = {}
        for path in sorted(pathlib.Path(tmp, "llmgw", "v1").iterdir()):
            if path.name.endswith(SUFFIXES):
                text = path.read_text().replace("from llmgw.v1 import", "from llmgw.api.v1 import")
                out[path.name] = text
        return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the committed code is stale")
    ns = parser.parse_args(argv)
    generated = generate()
    stale = [name for name, text in generated.items()
             if not (OUT_DIR / name).exists() or (OUT_DIR / name).read_text() != text]
    if ns.check:
        if stale:
            print(f"stale generated code: {', '.join(stale)}; run `python -m llmgw.api.codegen`",
                  file=sys.stderr)
            return 1
        return 0
    for name in stale:
        (OUT_DIR / name).write_text(generated[name])
        print(f"wrote {OUT_DIR / name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
