"""No import cycles in recipe/ or engine/.

Every import counts, wherever it sits: at the top, inside a function (a deferred import is a cycle put off, not
removed) or under `if TYPE_CHECKING:`. `from a.b import c` is an edge to the module a.b.c when that module exists,
else to a.b; a package's `__init__.py` is the package itself. A cycle is a strongly connected component of more
than one module, or a module that imports itself."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules_of(root: Path, package: str) -> dict[str, Path]:
    return {module_name(root, p): p for p in sorted((root / package).rglob("*.py"))}


def imported_names(tree: ast.Module, module: str, is_package: bool) -> list[tuple[str, list[str]]]:
    """Every import in the file as (module named, names taken from it); relative imports made absolute."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".") if is_package else module.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            found.append((base, [alias.name for alias in node.names]))
    return found


def resolve(name: str, known: set[str]) -> str | None:
    """The longest prefix of a dotted name that is one of our modules."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in known:
            return candidate
        parts.pop()
    return None


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    known = set(modules)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for base, names in imported_names(tree, name, path.name == "__init__.py"):
            targets = [f"{base}.{n}" if f"{base}.{n}" in known else base for n in names] or [base]
            for target in targets:
                resolved = resolve(target, known)
                if resolved is not None:
                    graph[name].add(resolved)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module, and self-imports (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(start: str) -> None:
        # Iterative, so a deep graph cannot hit the recursion limit.
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1 or node in graph[node]:
                        found.append(sorted(component))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return sorted(found)


def describe(found: list[list[str]]) -> str:
    return "\n".join(" <-> ".join(component) for component in found)


@pytest.mark.parametrize("package", ["recipe", "engine"])
def test_no_import_cycles(package: str) -> None:
    found = cycles(import_graph(modules_of(ROOT, package)))
    assert not found, (
        f"import cycles in {package}/ (move what both sides need into the lower module):\n{describe(found)}"
    )


def test_the_graph_sees_deferred_and_type_checking_imports(tmp_path: Path) -> None:
    """The checker itself: a cycle closed only by a function-level import or under TYPE_CHECKING is still found,
    `from pkg import mod` reaches the module, and a package importing itself counts."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg import b\n")
    (pkg / "b.py").write_text("def f():\n    from pkg.a import thing\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .d import X\n")
    (pkg / "d.py").write_text("import pkg.c\n")
    (pkg / "e.py").write_text("from pkg.sub import helper\n")
    (pkg / "sub" / "__init__.py").write_text("from .helper import run\nfrom pkg.sub import run as again\n")
    (pkg / "sub" / "helper.py").write_text("import os\n")
    graph = import_graph(modules_of(tmp_path, "pkg"))
    assert graph["pkg.e"] == {"pkg.sub.helper"}
    assert graph["pkg.sub"] == {"pkg.sub.helper", "pkg.sub"}
    assert cycles(graph) == [["pkg.a", "pkg.b"], ["pkg.c", "pkg.d"], ["pkg.sub"]]
