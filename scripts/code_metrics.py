"""How the package reads, in numbers: lines per module and per class, the longest functions,
and the cycles of its import graph (every import, those under TYPE_CHECKING included).

    python scripts/code_metrics.py [--json]

Used to measure a redesign before and after (issue 12); it reads the source, runs nothing.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "runtime" / "spillbox"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(tree: ast.Module, name: str, is_package: bool) -> set[str]:
    """The spillbox modules this module imports (relative imports resolved)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("spillbox"))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            if base.startswith("spillbox"):
                found.add(base)
                found.update(f"{base}.{a.name}" for a in node.names)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def measure() -> dict[str, object]:
    modules: dict[str, int] = {}
    classes: dict[str, int] = {}
    functions: list[tuple[int, str]] = []
    graph: dict[str, set[str]] = {}
    sources = sorted(PACKAGE.rglob("*.py"))
    names = {module_name(path) for path in sources}
    for path in sources:
        name = module_name(path)
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source)
        modules[name] = len(source.splitlines())
        edges = imports(tree, name, path.name == "__init__.py")
        # `from spillbox.x import y` names a module when y is one, else a name in x.
        graph[name] = {e for e in edges if e in names and e != name and e != "spillbox"}
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                classes[f"{name}.{node.name}"] = node.end_lineno - node.lineno + 1  # type: ignore[operator]
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                functions.append((length, f"{name}:{node.lineno} {node.name}"))
    # The public surface (spillbox/__init__) re-exports everything: it is not a layer.
    graph.pop("spillbox", None)
    return {
        "modules": dict(sorted(modules.items(), key=lambda kv: -kv[1])),
        "classes": dict(sorted(classes.items(), key=lambda kv: -kv[1])[:12]),
        "longest_functions": [f"{n} lines: {where}" for n, where in sorted(functions)[-8:][::-1]],
        "import_cycles": cycles(graph),
        "importers_of_harness": sorted(m for m, e in graph.items() if "spillbox.harness" in e),
    }


def main(argv: list[str]) -> int:
    figures = measure()
    if "--json" in argv:
        print(json.dumps(figures, indent=2))
        return 0
    for key, value in figures.items():
        print(f"## {key}")
        if isinstance(value, dict):
            for k, v in value.items():
                print(f"  {v:5}  {k}")
        else:
            for item in value:  # type: ignore[attr-defined]
                print(f"  {item}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
