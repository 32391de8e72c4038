"""The house's bounds, read from the source: sizes, and private names kept private.

A module of ``django_rcoord`` stays within 400 lines, a class within 250, a function within
50 (a subpackage holds what outgrows a module; a class that grows past its bound is doing
two jobs). No module imports a private name (``_name``) of a module outside its own
subpackage: tests, benchmarks and docs use what users use.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "django_rcoord"
BOUNDS = {"module": 400, "class": 250, "function": 50}

#: Past their bound for now, each for its reason; at most three. An entry that fits again
#: (or is gone) fails the test, so the list only shrinks.
ALLOWED: dict[tuple[str, str], str] = {}


def oversized(package: Path = PACKAGE) -> dict[tuple[str, str], int]:
    found: dict[tuple[str, str], int] = {}
    for path in sorted(package.rglob("*.py")):
        name = path.relative_to(package).as_posix()
        text = path.read_text()
        lines = len(text.splitlines())
        if lines > BOUNDS["module"]:
            found["module", name] = lines
        for node in ast.walk(ast.parse(text)):
            kind = {
                ast.ClassDef: "class",
                ast.FunctionDef: "function",
                ast.AsyncFunctionDef: "function",
            }.get(type(node))
            if kind is None:
                continue
            size = node.end_lineno - node.lineno + 1  # type: ignore[attr-defined]
            if size > BOUNDS[kind]:
                found[kind, f"{name}:{node.name}"] = size  # type: ignore[attr-defined]
    return found


def test_no_module_class_or_function_is_past_its_bound() -> None:
    found = oversized()
    assert len(ALLOWED) <= 3
    assert set(found) - set(ALLOWED) == set(), found
    assert set(ALLOWED) - set(found) == set(), "fits now: take it off ALLOWED"


def body(lines: int, indent: str = "    ") -> str:
    """``lines`` lines of statements."""
    return "".join(f"{indent}x = {n}\n" for n in range(lines))


def test_the_bounds_are_read_right(tmp_path: Path) -> None:
    # The scan finds what it should in a package made to the measure: each kind one line
    # past its bound (nested ones too), and beside it one exactly at its bound, not found.
    function = BOUNDS["function"]
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "long.py").write_text(body(BOUNDS["module"] + 1, ""))
    (tmp_path / "fits.py").write_text(body(BOUNDS["module"], ""))
    (tmp_path / "functions.py").write_text(
        f"def at_bound():\n{body(function - 1)}async def past_bound():\n{body(function)}"
    )
    (tmp_path / "big.py").write_text(
        f"class Big:\n    def method(self):\n{body(function, ' ' * 8)}"
        f"{body(BOUNDS['class'] - function - 1)}"
    )
    (tmp_path / "small.py").write_text(f"class Small:\n{body(BOUNDS['class'] - 1)}")
    assert oversized(tmp_path) == {
        ("module", "sub/long.py"): BOUNDS["module"] + 1,
        ("function", "functions.py:past_bound"): function + 1,
        ("function", "big.py:method"): function + 1,
        ("class", "big.py:Big"): BOUNDS["class"] + 1,
    }


def private_imports() -> list[str]:
    found: list[str] = []
    for folder in ("django_rcoord", "tests", "benchmarks", "docs"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.ImportFrom) or not node.module:
                    continue
                if not node.module.startswith("django_rcoord"):
                    continue
                # Within a subpackage (django_rcoord.locks.*), its modules share privately.
                home = ".".join(node.module.split(".")[:2])
                if module.startswith(home + "."):
                    continue
                found.extend(
                    f"{path.relative_to(ROOT)}:{node.lineno}: {node.module}.{alias.name}"
                    for alias in node.names
                    if alias.name.startswith("_")
                )
    return found


def test_no_module_imports_a_private_name_from_outside_its_subpackage() -> None:
    assert private_imports() == []
