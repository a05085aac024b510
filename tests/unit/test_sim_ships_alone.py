"""The sim engine ships alone as a wheel (``llmgw.testing.wheelhouse``: the package ``llmgw_sim_engine`` is
llmgw/sim/engine/ as it is, without llmgw), so what it imports when it starts must not need llmgw: a module that
does (the KV cache's publisher, the LoRA cache's rule) is imported only where that feature is used."""

from __future__ import annotations

import ast
from pathlib import Path

SIM = Path(__file__).resolve().parents[2] / "llmgw" / "sim" / "engine"


def _top_imports(path: Path) -> tuple[set[str], list[str]]:
    """The sibling modules ``path`` imports at its top level, and its top-level imports of llmgw."""
    siblings, ours = set(), []
    for node in ast.parse(path.read_text()).body:  # top level only: not in functions, not under TYPE_CHECKING
        if isinstance(node, ast.ImportFrom):
            if node.level == 1:
                siblings.add(node.module or "")
            elif (node.module or "").split(".")[0] == "llmgw":
                ours.append(f"from {node.module} import …")
        elif isinstance(node, ast.Import):
            ours += [f"import {a.name}" for a in node.names if a.name.split(".")[0] == "llmgw"]
    return siblings, ours


def test_nothing_the_sim_imports_at_start_needs_llmgw() -> None:
    seen, todo, found = set(), ["__init__", "__main__"], {}
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        siblings, ours = _top_imports(SIM / f"{name}.py")
        if ours:
            found[name] = ours
        todo += sorted(siblings - seen)
    assert {"app", "cli", "lora", "protocol"} <= seen  # the walk reached the modules it starts with
    assert found == {}, f"the sim's wheel would not start without llmgw: {found}"
