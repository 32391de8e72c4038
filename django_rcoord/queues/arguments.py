"""Whether a task's function accepts a run's arguments, said the way a caller can act on."""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any


def argument_problem(
    signature: inspect.Signature, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> str | None:
    """What is wrong with calling a function of ``signature`` with ``args`` and ``kwargs``,
    or None. Unexpected keyword arguments are named first: ``Signature.bind`` reports the
    first parameter it misses, so ``add(1, c=2)`` would be "missing 'b'" alone."""
    parameters = signature.parameters.values()
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        named = {
            p.name
            for p in parameters
            if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        }
        unexpected = sorted(set(kwargs) - named)
        if unexpected:
            return f"unexpected keyword argument(s) {', '.join(map(repr, unexpected))}"
    try:
        signature.bind(*args, **kwargs)
    except TypeError as exc:
        return str(exc)
    return None
