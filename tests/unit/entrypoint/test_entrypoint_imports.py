"""The entrypoint's modules import each other without cycles, lazy imports inside functions included."""

import ast
from pathlib import Path

import rlrig.entrypoint

PACKAGE = Path(rlrig.entrypoint.__file__).parent  # the installed package's sources, wherever it is installed
ABSOLUTE = "rlrig.entrypoint."


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """Sibling modules `path` imports anywhere in its body."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                out.add(node.module.split(".")[0])
            else:  # from . import a, b
                out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith(ABSOLUTE):
            out.add(node.module[len(ABSOLUTE) :].split(".")[0])
        elif isinstance(node, ast.Import):
            out.update(a.name[len(ABSOLUTE) :].split(".")[0] for a in node.names if a.name.startswith(ABSOLUTE))
    return out & modules


def graph() -> dict[str, set[str]]:
    modules = {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    return {m: imports_of(PACKAGE / f"{m}.py", modules) - {m} for m in modules}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, str] = {}

    def visit(m: str, path: list[str]) -> list[str] | None:
        state[m] = "open"
        for n in sorted(edges[m]):
            if state.get(n) == "open":
                return path[path.index(n) :] + [n] if n in path else path + [n]
            if n not in state:
                found = visit(n, path + [n])
                if found:
                    return found
        state[m] = "done"
        return None

    for m in sorted(edges):
        if m not in state:
            found = visit(m, [m])
            if found:
                return found
    return None


def test_no_import_cycles():
    edges = graph()
    assert {"cli", "bootstrap", "lifecycle", "launchers", "detection"} <= set(edges)
    assert find_cycle(edges) is None, " -> ".join(find_cycle(edges))


def test_the_cycle_finder_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
