"""The package's dependency direction (docs/architecture.md, "Dependency direction"), checked on
the source: every `import` of a `radixlm` module, read from the AST, without importing anything.

    kernels/, formats/, _version   import nothing of radixlm outside themselves
    lang/                          imports lang, formats, _version; and `interpreter` only from
                                   inside functions (or for type hints) of lang/function.py:
                                   the one allowed upward arrow, so that `prog.run()` works
    runtime/                       never imports lang/, interpreter/, bench/ or the top package
    no module-level or function-level import circle among radixlm modules
An import under `if TYPE_CHECKING:` is an arrow for the layer rules but never runs, so it does
not close a circle.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[1]  # the repository root is the `radixlm` package
SKIP = {".venv", "tests", "examples", "docs", "build", "dist"}


class Arrow(NamedTuple):
    src: str  # importing module, e.g. "radixlm.runtime.server.app"
    dst: str  # imported radixlm module (the longest prefix of the import that is a module)
    line: int
    lazy: bool  # inside a function: runs on call, not on import
    type_only: bool  # under `if TYPE_CHECKING:`: never runs


def _modules() -> dict[str, Path]:
    mods = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        top = rel.parts[0]
        if top in SKIP or top.startswith(".") or top.endswith(".egg-info"):  # hidden: not shipped
            continue
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(["radixlm", *parts])] = path
    return mods


def _arrows(mods: dict[str, Path]) -> list[Arrow]:
    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    out: list[Arrow] = []
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]

        def visit(node: ast.AST, lazy: bool, type_only: bool, mod: str = mod, pkg: str = package):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                    visit(child, True, type_only)
                    continue
                if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                    for stmt in child.body:
                        visit(ast.Module(body=[stmt], type_ignores=[]), lazy, True)
                    for stmt in child.orelse:
                        visit(ast.Module(body=[stmt], type_ignores=[]), lazy, type_only)
                    continue
                names: list[str] = []
                if isinstance(child, ast.Import):
                    names = [a.name for a in child.names]
                elif isinstance(child, ast.ImportFrom):
                    base = child.module or ""
                    if child.level:
                        up = pkg.split(".")[: len(pkg.split(".")) - child.level + 1]
                        base = ".".join([*up, *([base] if base else [])])
                    names = [base, *(f"{base}.{a.name}" for a in child.names)]
                for name in names:
                    dst = resolve(name) if name.split(".")[0] == "radixlm" else None
                    if dst and dst != mod:
                        out.append(Arrow(mod, dst, child.lineno, lazy, type_only))
                visit(child, lazy, type_only)

        visit(ast.parse(path.read_text(), str(path)), False, False)
    return list(dict.fromkeys(out))


MODULES = _modules()
ARROWS = _arrows(MODULES)


def _layer(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else "radixlm"


def _show(arrows: list[Arrow]) -> str:
    return "\n".join(
        f"  {a.src} -> {a.dst} (line {a.line}{', lazy' if a.lazy else ''})" for a in arrows
    )


def _bad(src_layer: str, allowed: set[str]) -> list[Arrow]:
    return [
        a
        for a in ARROWS
        if _layer(a.src) == src_layer and _layer(a.dst) not in allowed | {src_layer}
    ]


def test_walk_sees_the_package():
    layers = {_layer(m) for m in MODULES}
    assert {"lang", "interpreter", "runtime", "kernels", "formats", "_version"} <= layers
    assert any(a.dst == "radixlm.kernels.token_bitmask" for a in ARROWS)  # the walk finds arrows


@pytest.mark.parametrize("layer", ["kernels", "formats", "_version"])
def test_bottom_layers_import_nothing_of_radixlm(layer):
    bad = _bad(layer, set())
    assert not bad, f"{layer}/ must import nothing of radixlm outside itself:\n{_show(bad)}"


def test_runtime_never_imports_the_language_or_the_interpreter():
    bad = _bad("runtime", {"kernels", "formats", "_version"})
    assert not bad, f"runtime/ imports above itself:\n{_show(bad)}"


def test_lang_has_one_upward_arrow():
    bad = _bad("lang", {"formats", "_version", "interpreter"})
    assert not bad, f"lang/ must stay pure (no runtime, bench, ...):\n{_show(bad)}"
    up = [a for a in ARROWS if _layer(a.src) == "lang" and _layer(a.dst) == "interpreter"]
    wrong = [a for a in up if a.src != "radixlm.lang.function" or not (a.lazy or a.type_only)]
    assert not wrong, (
        "the one allowed upward arrow is lang -> interpreter from inside functions of "
        f"lang/function.py (`prog.run()`):\n{_show(wrong)}"
    )


def test_library_never_imports_bench_or_cli():
    bad = [
        a
        for a in ARROWS
        if _layer(a.src) in {"lang", "interpreter", "runtime", "kernels", "formats"}
        and _layer(a.dst) in {"bench", "cli", "demo", "__main__"}
    ]
    assert not bad, f"library code imports the command line or benchmarks:\n{_show(bad)}"


def _circles(arrows: list[Arrow]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    graph: dict[str, list[str]] = {m: [] for m in MODULES}
    for a in arrows:
        graph[a.src].append(a.dst)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(graph[child])))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_circles():
    runs = [a for a in ARROWS if not a.type_only]
    circles = _circles(runs)
    detail = "\n".join(
        f"{c}:\n{_show([a for a in runs if a.src in c and a.dst in c])}" for c in circles
    )
    assert not circles, f"import circles among radixlm modules:\n{detail}"


def test_pyproject_lists_every_package():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    listed = set(config["tool"]["setuptools"]["packages"])
    packages = {m for m, p in MODULES.items() if p.name == "__init__.py"}
    assert listed == packages, f"missing: {packages - listed}, stale: {listed - packages}"
