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


def _would_run(arch: str, tmp_path) -> list[str]:
    """The GPU tests (node ids) that would run on the synthetic device of ``arch``: the suite collected with
    TRITONSOFTMAX_TEST_AS, conftest writing the list to TRITONSOFTMAX_TEST_LIST."""
    import os
    import subprocess
    import sys

    listing = tmp_path / f"{arch}.txt"
    env = {**os.environ, "TRITONSOFTMAX_TEST_AS": arch, "TRITONSOFTMAX_TEST_LIST": str(listing)}
    command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "gpu", "-p", "no:cacheprovider", "tests"]
    done = subprocess.run(command, cwd=PACKAGE.parent, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return listing.read_text().split()


def _code_of(fn) -> str:
    """A function's statements: not its decorators (parameters a needs() mark may cover), not its docstring."""
    import inspect
    import textwrap

    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    body = tree.body[0].body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return "\n".join(ast.unparse(stmt) for stmt in body)


def test_the_gpu_tests_left_on_an_amd_device_use_nothing_nvidia_only(tmp_path):
    """Collected as on an MI300X (gfx942, wave64) and an RX 9070 XT (gfx1201, wave32), the GPU tests that would run
    name nothing only NVIDIA has (tests/capabilities.NVIDIA_ONLY: resident launches, clusters, PDL, smem, CUPTI,
    Triton's CUDA launcher, the stagger, the H200's table): those carry a needs() mark and are skipped there. The
    H200 runs them all."""
    import importlib
    import sys

    sys.path.insert(0, str(PACKAGE.parent / "tests"))
    from capabilities import NVIDIA_ONLY

    h200 = set(_would_run("sm_90", tmp_path))
    for arch in ("gfx942", "gfx1201"):
        runs = _would_run(arch, tmp_path)
        assert runs and set(runs) < h200, arch
        for node in runs:
            path, name = node.split("::")[:2]
            module = importlib.import_module(Path(path).stem)
            word = NVIDIA_ONLY.search(_code_of(getattr(module, name.split("[")[0])))
            assert word is None, f"{node} would run on {arch} but uses {word.group(0)!r}"
        print(f"{arch}: {len(runs)} of {len(h200)} GPU tests would run")


def test_only_the_tuners_write_the_tuning_store():
    """tuning.record / record_winner are called from the tuner modules only (tune.py, tune_dispatch.py)."""
    import re

    writers = {p.name for p in PACKAGE.rglob("*.py")
               if p.name != "tuning.py" and re.search(r"tuning\.(record|record_winner)\(", p.read_text())}
    assert writers <= {"tune.py", "tune_dispatch.py"}, writers
