"""Documentation that cannot drift from the code: directives that read it at build time.

``{rcoord-lua-scripts}`` renders the header comment of every Lua script the app ships
(KEYS, ARGV and what it returns), read from the ``.lua`` files themselves.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from docutils import nodes
from sphinx.util.docutils import SphinxDirective

ROOT = Path(__file__).resolve().parents[2]


def lua_scripts() -> list[Path]:
    """Every script of the app, wherever its ``lua/`` directory sits in the package."""
    return sorted((ROOT / "django_rcoord").rglob("lua/*.lua"), key=lambda path: path.name)


def header(path: Path) -> str:
    """The comment lines at the top of a script (its contract), ``--! include`` lines too."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("--"):
            break
        lines.append(line)
    return "\n".join(lines)


class LuaScripts(SphinxDirective):
    has_content = False

    def run(self) -> list[nodes.Node]:
        result: list[nodes.Node] = []
        for path in lua_scripts():
            self.env.note_dependency(str(path))
            name = path.stem
            text = header(path) or "-- (no header)"
            result.append(nodes.rubric(text=path.name, ids=[f"lua-{name.strip('_')}"]))
            result.append(nodes.literal_block(text, text, language="lua"))
        return result


def setup(app: Any) -> dict[str, Any]:
    app.add_directive("rcoord-lua-scripts", LuaScripts)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
