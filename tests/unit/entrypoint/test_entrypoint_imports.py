"""The entrypoint's modules import each other without cycles, lazy imports inside functions included, and each
stage's folder imports only the stages before it: detect -> preflight -> cluster -> fabric, jobs -> the top (cli,
bootstrap, lifecycle, ...), which may import any. errors and console, at the top, are for every stage."""

import ast
from pathlib import Path

import rlrig.entrypoint

PACKAGE = Path(rlrig.entrypoint.__file__).parent  # the installed package's sources, wherever it is installed
ABSOLUTE = "rlrig.entrypoint"
# each stage's folder -> the folders it may import
BEFORE = {
    "detect": set(),
    "preflight": {"detect"},
    "cluster": {"detect", "preflight"},
    "fabric": {"detect", "preflight", "cluster"},
    "jobs": {"detect", "preflight", "cluster"},
}
SHARED = {"errors", "console"}  # top-level modules every stage uses


def modules() -> dict[str, Path]:
    """Each module by its dotted name inside the package (`detect.launchers`, `cli`); package __init__s left out."""
    out = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name != "__init__.py":
            out[".".join(path.relative_to(PACKAGE).with_suffix("").parts)] = path
    return out


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules `name` imports anywhere in its body."""
    package = name.split(".")[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - (node.level - 1)]
            target = ".".join(base + (node.module.split(".") if node.module else []))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(ABSOLUTE):
            target = node.module[len(ABSOLUTE) :].lstrip(".")
        elif isinstance(node, ast.Import):
            out.update(a.name[len(ABSOLUTE) + 1 :] for a in node.names if a.name.startswith(ABSOLUTE + "."))
            continue
        else:
            continue
        for a in node.names:  # `from .cluster import auth` imports the module cluster.auth
            sub = f"{target}.{a.name}" if target else a.name
            out.add(sub if sub in known else target)
    return out & known


def graph() -> dict[str, set[str]]:
    found = modules()
    return {m: imports_of(m, path, set(found)) - {m} for m, path in found.items()}


def stage(module: str) -> str:
    return module.split(".")[0] if "." in module else ""


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
    assert {"cli", "bootstrap", "lifecycle", "detect.launchers", "detect.detection"} <= set(edges)
    assert edges["lifecycle"] >= {"restarts", "cluster.coordination", "jobs.standing"}  # the graph sees every form
    assert find_cycle(edges) is None, " -> ".join(find_cycle(edges))


def test_each_stage_imports_only_the_stages_before_it():
    edges = graph()
    assert set(BEFORE) == {stage(m) for m in edges} - {""}, "a new folder: say which stages it may import"
    backwards = [
        f"{m} -> {n}"
        for m, imported in sorted(edges.items())
        if stage(m)
        for n in sorted(imported)
        if stage(n) != stage(m) and stage(n) not in BEFORE[stage(m)] and n not in SHARED
    ]
    assert not backwards, backwards


def test_the_top_holds_at_most_twelve_modules():
    assert len([m for m in modules() if not stage(m)]) <= 12  # a new module goes into its stage's folder


def test_the_cycle_finder_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
