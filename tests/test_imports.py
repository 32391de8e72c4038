"""Every module of django_rcoord and benchmarks imports, and no two of them import each other.

The import graph is read from the source with ``ast``. An edge A -> B stands for an
``import B`` or ``from B import name`` anywhere in A: at module level, and also inside a
function or class body. A deferred import still ties the two modules together (it only
moves the failure to the first call), and a deferred import of a ``__main__`` module runs
that module a second time under ``python -m``. Imports under ``if TYPE_CHECKING:`` are left
out: they never run. ``from package import name`` is an edge to ``package.name`` when that
is a module, else to ``package``; ``import a.b.c`` is an edge to ``a.b.c`` alone (a
package's ``__init__`` importing its own submodules is not a cycle).
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from tests.procs import run_python

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("django_rcoord", "benchmarks")

#: Cycles allowed, each an exact strongly connected set of modules (none now). A listed
#: cycle that is gone or changed fails the test, so this list only shrinks.
KNOWN_CYCLES: set[frozenset[str]] = set()


def module_files(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Dotted module name -> source file, for every module of ``packages`` under ``root``."""
    modules = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement of ``tree``, at any depth, except under ``if TYPE_CHECKING:``."""
    found: list[ast.Import | ast.ImportFrom] = []
    pending: list[ast.AST] = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            pending.extend(node.orelse)
            continue
        pending.extend(ast.iter_child_nodes(node))
    return found


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of ``modules`` it imports."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    target = alias.name
                    while target and target not in modules:
                        target = target.rpartition(".")[0]  # import a.b.c where c is a name
                    if target:
                        edges.add(target)
                continue
            if node.level:
                base_parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*base_parts, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            for alias in node.names:
                if f"{base}.{alias.name}" in modules:
                    edges.add(f"{base}.{alias.name}")
                elif base in modules:
                    edges.add(base)
        edges.discard(name)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected sets of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in sorted(graph[module]):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def a_path_around(graph: dict[str, set[str]], component: frozenset[str]) -> str:
    """One concrete cycle through ``component``, e.g. ``a -> b -> a``, for the message."""
    start = min(component)
    paths = {start: [start]}
    pending = [start]
    while pending:
        module = pending.pop(0)
        for target in sorted(graph[module] & component):
            if target == start:
                return " -> ".join([*paths[module], start])
            if target not in paths:
                paths[target] = [*paths[module], target]
                pending.append(target)
    raise AssertionError(f"no cycle through {sorted(component)}")


def describe(graph: dict[str, set[str]], components: list[frozenset[str]]) -> str:
    return "\n".join(
        f"{sorted(component)}, e.g. {a_path_around(graph, component)}" for component in components
    )


# -- the project --------------------------------------------------------------------------
def test_no_import_cycles() -> None:
    graph = import_graph(module_files(ROOT, PACKAGES))
    new = [component for component in cycles(graph) if component not in KNOWN_CYCLES]
    assert not new, "import cycles:\n" + describe(graph, new)


def test_known_cycles_are_still_there() -> None:
    found = set(cycles(import_graph(module_files(ROOT, PACKAGES))))
    gone = [sorted(component) for component in KNOWN_CYCLES if component not in found]
    assert not gone, f"no longer a cycle, remove from KNOWN_CYCLES: {gone}"


def test_nothing_imports_a_main_module() -> None:
    graph = import_graph(module_files(ROOT, PACKAGES))
    importers = {
        (module, target)
        for module, targets in graph.items()
        for target in targets
        if target.rpartition(".")[2] == "__main__"
    }
    assert not importers  # under python -m, the importer would run it a second time


def test_commands_share_helpers_not_each_other() -> None:
    graph = import_graph(module_files(ROOT, PACKAGES))
    prefix = "django_rcoord.management.commands."
    between = {
        (module, target)
        for module, targets in graph.items()
        if module.startswith(prefix)
        for target in targets
        if target.startswith(prefix)
    }
    assert not between  # shared helpers live in django_rcoord.management.base
    assert "django_rcoord.management.base" in graph["django_rcoord.management.worker"]
    assert "django_rcoord.management.worker" in graph[prefix + "run_email_worker"]
    assert "django_rcoord.management.worker" in graph[prefix + "rcoord_worker"]
    assert "django_rcoord.management.base" in graph[prefix + "poll_delayed"]


def test_the_checks_read_rules_without_the_middleware() -> None:
    graph = import_graph(module_files(ROOT, PACKAGES))
    assert "django_rcoord.middleware" not in graph["django_rcoord.semaphores.checks"]
    assert "django_rcoord.semaphores.rules" in graph["django_rcoord.semaphores.checks"]
    assert "django_rcoord.semaphores.rules" in graph["django_rcoord.middleware"]


#: How each package sets Django up before its modules are imported: the test settings, and
#: the benchmarks' own configuration (no server is reached at import).
DJANGO_SETUP = {
    "django_rcoord": "import django; django.setup()",
    "benchmarks": "from benchmarks.common import configure_django; "
    "configure_django('redis://127.0.0.1:1/0')",
}


@pytest.mark.parametrize("package", PACKAGES)
def test_every_module_imports_in_a_fresh_interpreter(package: str) -> None:
    names = sorted(module_files(ROOT, (package,)))
    code = (
        f"import importlib, sys\n{DJANGO_SETUP[package]}\n"
        "for name in sys.argv[1:]:\n"
        "    importlib.import_module(name)\n"
        "print('imported', len(sys.argv) - 1)\n"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    if package != "django_rcoord":
        del env["DJANGO_SETTINGS_MODULE"]
    result = run_python("-c", code, *names, cwd=ROOT, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"imported {len(names)}"


# -- the detector itself ------------------------------------------------------------------
def write_package(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_detector_finds_module_level_and_deferred_cycles(tmp_path: Path) -> None:
    write_package(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg.a import thing\n",
            "pkg/a.py": "from . import b\nthing = 1\n",
            "pkg/b.py": "import pkg.a.thing\n",
            "pkg/c.py": "def later():\n    from pkg.sub import d\n",
            "pkg/sub/__init__.py": "",
            "pkg/sub/d.py": "class D:\n    def m(self):\n        from ..c import later\n",
            "pkg/e.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.f\n",
            "pkg/f.py": "import pkg.e\n",
        },
    )
    graph = import_graph(module_files(tmp_path, ("pkg",)))
    assert graph["pkg"] == {"pkg.a"}  # a package importing its own module is no cycle
    assert graph["pkg.a"] == {"pkg.b"}  # relative, from a module
    assert graph["pkg.b"] == {"pkg.a"}  # import a.b.c where c is a name
    assert graph["pkg.sub.d"] == {"pkg.c"}  # relative, two levels, inside a method
    assert graph["pkg.e"] == set()  # TYPE_CHECKING only
    found = set(cycles(graph))
    assert found == {frozenset({"pkg.a", "pkg.b"}), frozenset({"pkg.c", "pkg.sub.d"})}
    assert a_path_around(graph, frozenset({"pkg.c", "pkg.sub.d"})) == "pkg.c -> pkg.sub.d -> pkg.c"


def test_each_capability_owns_its_checks() -> None:
    """The core check runs every capability's own checks module and holds none of theirs."""
    graph = import_graph(module_files(ROOT, PACKAGES))
    rooms = {"autocomplete", "locks", "ops", "queues", "semaphores"}
    assert {f"django_rcoord.{room}.checks" for room in rooms} <= graph["django_rcoord.checks"]
    assert not any(
        target.startswith(f"django_rcoord.{room}.") and not target.endswith(".checks")
        for room in rooms
        for target in graph["django_rcoord.checks"]
    )


#: Every import inside a function of the package, by (module, function, what it imports),
#: each with its reason. None of them is there to dodge an import cycle (a module-level
#: import would work, and the graph above would still show a cycle): a new one fails the
#: test until it is hoisted or given a reason of its own.
OPTIONAL = "an optional dependency, imported only on the path that uses it"
APPS_READY = "needs Django's apps loaded: imported once they are (AppConfig.ready or later)"
FRAMEWORK = "imports the Tasks framework, which a project may not have"
DEFERRED_IMPORTS = {
    ("apps.py", "ready", "django_rcoord"): APPS_READY + " (opens the connection module)",
    ("apps.py", "ready", "django_rcoord.checks"): APPS_READY + " (registers the checks)",
    ("apps.py", "ready", "django_rcoord.embedded.checks"): APPS_READY,
    ("apps.py", "_register_the_task_backends_checks", "django_rcoord.queues.framework"): (
        FRAMEWORK
    ),
    ("apps.py", "_link_the_admin_index", "django.contrib"): "django.contrib.admin is optional",
    ("connection/convert.py", "_driver_info", "redis.driver_info"): "redis-py 7 and later",
    ("connection/convert.py", "_driver_info", "redis.utils"): "redis-py 7 and later",
    ("embedded/server.py", "_start_lock", "fcntl"): "POSIX only: the module imports anywhere",
    ("ops/dashboard.py", "_context", "django.contrib"): "django.contrib.admin is optional",
    ("ops/dashboard.py", "_message", "django.contrib"): "django.contrib.messages is optional",
    ("ops/prometheus.py", "prometheus_exposition", "prometheus_client"): OPTIONAL,
    ("ops/prometheus.py", "prometheus_exposition", "prometheus_client.exposition"): OPTIONAL,
    ("ops/prometheus.py", "_queues_and_workers", "prometheus_client.core"): OPTIONAL,
    ("ops/prometheus.py", "_task_runs", "prometheus_client.core"): OPTIONAL,
    ("ops/prometheus.py", "_lateness", "prometheus_client.core"): OPTIONAL,
    ("ops/prometheus.py", "_task_controls", "prometheus_client.core"): OPTIONAL,
    ("ops/views.py", "metrics", "django_rcoord.ops.prometheus"): OPTIONAL,
    ("queues/__init__.py", "send_sold_email_via_queue", "django_rcoord.tasks"): APPS_READY
    + " (the app's tasks module reads django.contrib.auth when imported)",
    ("queues/checks.py", "_check_options_set_twice", "django_rcoord.queues.task_class"): (
        FRAMEWORK
    ),
    ("queues/framework.py", "register_checks", "django.tasks.checks"): FRAMEWORK,
    ("queues/framework.py", "register_checks", "django_tasks.checks"): FRAMEWORK,
    ("queues/schedules.py", "resolve_target", "django_rcoord.queues.backend"): FRAMEWORK,
    ("queues/worker/isolation.py", "serve_tasks", "django"): "a task process sets Django up",
    ("queues/worker/resolve.py", "resolve", "django_rcoord.queues.framework_runs"): FRAMEWORK,
    ("queues/fan_in.py", "_request", "django_rcoord.queues.backend"): FRAMEWORK,
    ("queues/worker/watch.py", "_framework_queues", "django_rcoord.queues"): FRAMEWORK,
    ("queues/worker/watch.py", "_framework_queues", "django_rcoord.queues.backend"): FRAMEWORK,
}


def deferred_imports(root: Path) -> set[tuple[str, str, str]]:
    """(module, function, imported module) for each import inside a function of the package
    (``from . import x`` named as its absolute module)."""
    found: set[tuple[str, str, str]] = set()
    for path in sorted((root / "django_rcoord").rglob("*.py")):
        name = path.relative_to(root / "django_rcoord").as_posix()
        package = ".".join(path.relative_to(root).parent.parts)
        for function in ast.walk(ast.parse(path.read_text())):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in _imports(function):
                if isinstance(node, ast.Import):
                    found.update((name, function.name, alias.name) for alias in node.names)
                else:
                    base = package.rsplit(".", node.level - 1)[0] if node.level else ""
                    module = ".".join(part for part in (base, node.module or "") if part)
                    found.add((name, function.name, module))
    return found


def test_every_import_inside_a_function_has_its_reason() -> None:
    found = deferred_imports(ROOT)
    assert found - DEFERRED_IMPORTS.keys() == set(), "new: hoist it, or give it its reason"
    assert DEFERRED_IMPORTS.keys() - found == set(), "gone: take it off DEFERRED_IMPORTS"


def test_deferred_imports_are_found_at_any_depth(tmp_path: Path) -> None:
    package = tmp_path / "django_rcoord" / "inner"
    package.mkdir(parents=True)
    (package / "mod.py").write_text(
        "import os\n\ndef f():\n    if True:\n        from . import sibling\n"
        "    import json\n\nclass C:\n    async def g(self):\n        from x.y import z\n"
    )
    assert deferred_imports(tmp_path) == {
        ("inner/mod.py", "f", "django_rcoord.inner"),
        ("inner/mod.py", "f", "json"),
        ("inner/mod.py", "g", "x.y"),
    }
