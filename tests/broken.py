"""A module with a bug that raises when it is imported (the checks' tests name it)."""

raise RuntimeError("tests.broken raises on import")
