"""The folder tree shows the architecture: the product never imports the harness (issue 21).

Product: every module of ``thunder_sgl`` outside the harness — ``gateway``, ``control``,
``scheduler``, ``programs``, ``backends``, ``sandboxes``, ``engine``, ``config``, ``errors``,
``children``, ``textgen``, ``smoothing``, ``launch_router``. Harness: the simulator
(``thunder_sgl.sim``) and the benchmark (``thunder_sgl.benchmark``); they import the product,
never the other way round.

One exception, stated precisely: the command line (``cli.py``, and ``__main__.py`` which runs
it) is the entry point of both, so ``thunder-sgl sim|bench|demo|soak`` import the harness
inside the functions that run those commands; at module level it imports no harness either.
Every other product module is checked everywhere, function bodies and ``TYPE_CHECKING``
blocks included, and by importing it.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import thunder_sgl

PACKAGE = Path(thunder_sgl.__file__).resolve().parent
HARNESS = ("thunder_sgl.sim", "thunder_sgl.benchmark")
COMMAND_LINE = {"thunder_sgl.cli", "thunder_sgl.__main__"}
"""May import the harness inside functions (the commands that run it), not at module level."""
NOT_IMPORTABLE_HERE = {"thunder_sgl.__main__", "thunder_sgl.engine._build_model"}
"""``__main__`` runs the command line; ``_build_model`` runs in the SGLang venv (torch)."""


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def product_modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        if not any(name == h or name.startswith(h + ".") for h in HARNESS):
            out[name] = path
    return out


def _package_of(module: str, is_package: bool) -> list[str]:
    parts = module.split(".")
    return parts if is_package else parts[:-1]


def _nodes(tree: ast.AST, module_level_only: bool):  # noqa: ANN202
    """Every node, or only those that run at import (not inside a function or a lambda)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if module_level_only and isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            stack.append(child)


def imported_names(source: str, module: str, is_package: bool = False,
                   module_level_only: bool = False) -> list[tuple[int, str]]:
    """(line, dotted name) of everything ``source`` imports: ``import a.b``, ``from a import b``
    (as ``a.b``), relative imports resolved against ``module``, and ``importlib.import_module``
    or ``__import__`` with a constant name."""
    found: list[tuple[int, str]] = []
    for node in _nodes(ast.parse(source), module_level_only):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = _package_of(module, is_package)
                pkg = pkg[: len(pkg) - (node.level - 1)]
                base = ".".join([*pkg, *([base] if base else [])])
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{a.name}") for a in node.names if a.name != "*"]
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and ((isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                   or (isinstance(node.func, ast.Name) and node.func.id in ("import_module", "__import__")))):
            found.append((node.lineno, node.args[0].value))
    return found


def harness_imports(source: str, module: str, is_package: bool = False,
                    module_level_only: bool = False) -> list[str]:
    flagged: dict[int, str] = {}
    for line, name in imported_names(source, module, is_package, module_level_only):
        if any(name == h or name.startswith(h + ".") for h in HARNESS):
            flagged[line] = min(flagged.get(line, name), name, key=len)
    return [f"{module}:{line} imports {name}" for line, name in sorted(flagged.items())]


@pytest.mark.parametrize(("source", "module", "flagged"), [
    ("from thunder_sgl.sim import SimWorker", "thunder_sgl.gateway.app", True),
    ("import thunder_sgl.benchmark.des.run", "thunder_sgl.engine.serve", True),
    ("from thunder_sgl import sim", "thunder_sgl.config", True),
    ("from thunder_sgl import benchmark as b", "thunder_sgl.config", True),
    ("from ..sim.timing import Roofline", "thunder_sgl.scheduler.cost", True),
    ("from . import sim", "thunder_sgl.config", True),
    ("def f():\n    from thunder_sgl.benchmark.harness import run_bench\n", "thunder_sgl.control.controller", True),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from thunder_sgl.sim import Completion\n",
     "thunder_sgl.gateway.proxy", True),
    ("import importlib\nm = importlib.import_module('thunder_sgl.sim.server')\n", "thunder_sgl.gateway.app", True),
    ("from thunder_sgl.simple import x\nfrom thunder_sgl.benchmarks import y\n", "thunder_sgl.config", False),
    ("from thunder_sgl.programs import Program\nfrom .tickets import Ticket\n", "thunder_sgl.control.controller", False),
    ("'''python -m thunder_sgl.sim starts simulated workers'''\n", "thunder_sgl.launch_router", False),
])
def test_the_check_sees_every_form_of_import(source, module, flagged):
    assert bool(harness_imports(source, module)) is flagged


def test_the_command_line_may_import_the_harness_only_inside_its_commands():
    src = "from thunder_sgl import __version__\n\ndef _bench():\n    from thunder_sgl.benchmark.harness import run_bench\n"
    assert harness_imports(src, "thunder_sgl.cli", module_level_only=True) == []
    assert harness_imports("from thunder_sgl.benchmark.harness import run_bench\n", "thunder_sgl.cli",
                           module_level_only=True)


def test_the_product_and_the_harness_are_where_the_layout_says():
    product = product_modules()
    for name in ("thunder_sgl.gateway.app", "thunder_sgl.control.controller", "thunder_sgl.scheduler.core",
                 "thunder_sgl.programs.program", "thunder_sgl.backends.monitor", "thunder_sgl.sandboxes.config",
                 "thunder_sgl.engine.serve", "thunder_sgl.config", "thunder_sgl.errors", "thunder_sgl.children"):
        assert name in product, name
    for harness in ("sim", "benchmark"):
        assert (PACKAGE / harness / "__init__.py").is_file()
        assert not any(n.startswith(f"thunder_sgl.{harness}") for n in product)


def test_no_product_module_imports_the_harness():
    bad = []
    for name, path in product_modules().items():
        bad += harness_imports(path.read_text(), name, is_package=path.name == "__init__.py",
                               module_level_only=name in COMMAND_LINE)
    assert not bad, "the product imports the harness:\n" + "\n".join(bad)


def test_importing_the_whole_product_loads_no_harness_module():
    """The same at run time, in a fresh interpreter: every product module imported, no harness
    module among those loaded."""
    names = sorted(set(product_modules()) - NOT_IMPORTABLE_HERE)
    code = ("import importlib, sys\n"
            f"for n in {names!r}:\n"
            "    importlib.import_module(n)\n"
            f"print('\\n'.join(m for m in sys.modules if m.startswith({HARNESS!r})))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == [], r.stdout
