"""How the package is put together: layers that point one way, no import circle, small modules."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "tritonsoftmax"
ABOVE_KERNELS = {"api", "ops", "execute", "dispatch", "policy", "tuning", "tune", "tune_dispatch", "patch", "modules"}


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join(parts) or "__init__"


def _imports(path: Path, top_level_only: bool) -> set[str]:
    """The package modules ``path`` imports (relative or absolute), at module level only or anywhere."""
    name = _module_name(path)
    # The package a relative import starts from: the module's own for an __init__, else its parent's.
    if path.name == "__init__.py":
        package = "" if name == "__init__" else name
    else:
        package = name.rsplit(".", 1)[0] if "." in name else ""
    nodes = ast.parse(path.read_text()).body if top_level_only else list(ast.walk(ast.parse(path.read_text())))
    out = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".") if package else []
                base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
                mod = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.startswith("tritonsoftmax"):
                mod = node.module[len("tritonsoftmax") + 1:]
            else:
                continue
            out.add(mod or "__init__")
            for alias in node.names:  # from . import dispatch: the submodule
                out.add(f"{mod}.{alias.name}" if mod else alias.name)
        elif isinstance(node, ast.Import):
            out |= {a.name[len("tritonsoftmax") + 1:] for a in node.names if a.name.startswith("tritonsoftmax.")}
    modules = {_module_name(p) for p in PACKAGE.rglob("*.py")}
    # The top package's __init__ only re-exports what its modules define: an edge to it is no dependency.
    return {m for m in out if m in modules and m not in (name, "__init__")}


def test_kernels_import_neither_dispatch_nor_tuning_nor_anything_above():
    for path in (PACKAGE / "kernels").glob("*.py"):
        above = {m for m in _imports(path, top_level_only=False) if m.split(".")[0] in ABOVE_KERNELS}
        assert not above, f"{path.name} imports {sorted(above)}"


def test_no_import_circle_at_module_level():
    graph = {_module_name(p): _imports(p, top_level_only=True) for p in PACKAGE.rglob("*.py")}

    def visit(node, stack):
        assert node not in stack, " -> ".join(stack[stack.index(node):] + [node])
        for nxt in graph.get(node, ()):
            visit(nxt, stack + [node])

    for start in graph:
        visit(start, [])


def test_no_module_over_500_lines():
    long = {p.name: n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > 500}
    assert not long, long
