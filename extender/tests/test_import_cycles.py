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


def imported_names() -> dict[str, set[str]]:
    """Every module's imports, by their absolute names (relative ones resolved), whatever package they are in."""
    found: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        name = _module_name(path)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = found.setdefault(name, set())
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join([*package.split(".")[: len(package.split(".")) - node.level + 1], base]).strip(".")
                targets.update([base, *(f"{base}.{alias.name}" for alias in node.names)])
    return found


def _lab(target: str) -> bool:
    return target == "gpufleet_lab" or target.startswith("gpufleet_lab.")


def test_the_server_never_imports_the_lab():
    # The lab (gpufleet-lab: the simulator, the vector generator) imports the extender like any user of it, never the
    # reverse: an import of it from here would put the lab back into the server's wheel and image.
    found = imported_names()
    assert "gpufleet_extender.mig_utils.names" in found["gpufleet_extender.pods"]  # the walk sees real imports
    assert _lab("gpufleet_lab.simulate.cli") and not _lab("gpufleet_labx")
    importing_the_lab = {
        name: sorted(filter(_lab, targets)) for name, targets in found.items() if any(map(_lab, targets))
    }
    assert importing_the_lab == {}


def test_of_the_library_the_server_imports_its_two_shared_rules_alone():
    # The wheel ships names and pod_requests of plugins/module_utils (pyproject.toml's py-modules); the development
    # install maps the whole folder, so an import of another module would pass here and fail in the image.
    shared = {
        "gpufleet_extender.mig_utils",
        "gpufleet_extender.mig_utils.names",
        "gpufleet_extender.mig_utils.pod_requests",
    }
    library = {
        target
        for targets in imported_names().values()
        for target in targets
        if target.startswith("gpufleet_extender.mig_utils.") and target.count(".") == 2
    }
    assert library <= shared, sorted(library - shared)
