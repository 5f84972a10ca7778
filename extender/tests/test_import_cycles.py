"""No import cycles between the extender's modules: each module's imports (at the top, in functions, under
TYPE_CHECKING alike) form a graph without a cycle, so each module can be read and tested below the ones it uses."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "gpufleet_extender"


def _module_name(path: Path) -> str:
    parts = ("gpufleet_extender", *path.relative_to(PACKAGE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    modules = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join([*package.split(".")[: len(package.split(".")) - node.level + 1], base]).strip(".")
                targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
            else:
                continue
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found, state, stack = [], {}, []

    def visit(node: str) -> None:
        state[node] = "open"
        stack.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == "open":
                found.append([*stack[stack.index(target) :], target])
            elif target not in state:
                visit(target)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found


def test_the_graph_sees_imports_of_every_kind():
    graph = import_graph()
    assert "gpufleet_extender.scoring" in graph["gpufleet_extender.config"]  # from ... import at the top
    assert "gpufleet_extender.snapshot" in graph["gpufleet_extender.parse_worker"]
    assert cycles({"a": {"b"}, "b": {"a"}}) == [["a", "b", "a"]]


def test_no_module_imports_itself_back():
    assert cycles(import_graph()) == []
