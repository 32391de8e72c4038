"""Lua scripts: read from ``django_rcoord/lua/<name>.lua`` once, run by EVALSHA.

``run_script`` sends EVALSHA with the script's SHA1 (computed once per
process) and, on NOSCRIPT (a server that has not seen the script yet, or was
restarted, or flushed its script cache), SCRIPT LOAD and EVALSHA again. On a
pipeline it hands the call to redis-py's ``Script``, which loads missing
scripts before the pipeline runs. A script is therefore sent in full at most
once per server, and each later call is a single EVALSHA round trip.
``arun_script`` does the same on ``redis.asyncio`` clients and pipelines, with
the same ``Script`` objects.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from importlib import resources
from typing import Any

from redis.asyncio.client import Pipeline as AsyncPipeline
from redis.client import Pipeline
from redis.commands.core import Script
from redis.exceptions import NoScriptError

_INCLUDE = re.compile(rb"^--! include (?:([\w.]+):)?(\w+)$", re.MULTILINE)


def _source(name: str, package: str, spliced: set[tuple[str, str]] | None = None) -> bytes:
    """The script's text, each ``--! include <name>`` line replaced by ``lua/<name>.lua``
    (helpers several scripts share, defined once); ``--! include <package>:<name>``
    includes another package's helper (a project's script including
    ``django_rcoord:_enqueue`` queues a task in the same step as its own writes).

    Each helper includes what it uses, so a script names only the helpers it calls, in
    any order: a helper is spliced where it is first included, after what it includes,
    and once (``spliced``: the helpers already in the text)."""
    spliced = set() if spliced is None else spliced
    spliced.add((package, name))
    source = (resources.files(package) / "lua" / f"{name}.lua").read_bytes()

    def included(match: re.Match[bytes]) -> bytes:
        helper = (match[1].decode() if match[1] else package, match[2].decode())
        if helper in spliced:
            return b"-- (" + helper[1].encode() + b": above)"
        return _source(helper[1], helper[0], spliced).rstrip(b"\n")

    return _INCLUDE.sub(included, source)


#: A script's KEYS, as str or bytes.
Keys = Sequence[str | bytes]
#: The package whose ``lua/`` folder holds the project's own scripts.
OURS = "django_rcoord"


@functools.cache
def get_script(name: str, package: str = OURS) -> Script:
    """Return the ``Script`` for ``<package>/lua/<name>.lua``, reading the file on first use.

    Projects keep their own scripts the same way (``package="myapp"``).
    """
    source = _source(name, package)
    # Given bytes, Script needs no client to compute its SHA1, so one object
    # serves every client (Redis, RedisCluster, pipelines) of the process.
    return Script(None, source)  # type: ignore[arg-type]  # redis-py types the client required; None works with bytes


def run_script(
    name: str, client: Any, keys: Keys = (), args: Sequence[Any] = (), *, package: str = OURS
) -> Any:
    """Run script ``name`` of ``package`` on ``client`` (one round trip)."""
    script, sha = _evalsha_of(name, package)
    client_class: type = type(client)
    if _is_pipeline(client_class):
        return script(keys=keys, args=args, client=client)
    # EVALSHA straight from the SHA1 as bytes, through execute_command (what evalsha()
    # reaches after two more calls that repack every argument): the one place we go past
    # redis-py's Script.__call__, which does more per call (an import, tuple copies, the
    # SHA1 encoded again). It pays: ``python -m benchmarks --only producer`` measures the
    # two side by side (1.06x the calls per second, on loopback, 2026-11-26).
    try:
        return client.execute_command("EVALSHA", sha, len(keys), *keys, *args)
    except NoScriptError:
        client.script_load(script.script)
        return client.execute_command("EVALSHA", sha, len(keys), *keys, *args)


@functools.cache
def _evalsha_of(name: str, package: str) -> tuple[Script, bytes]:
    """The script and its SHA1 as bytes, found with one look-up per call."""
    script = get_script(name, package)
    return script, script.sha.encode()


@functools.cache
def _is_pipeline(kind: type) -> bool:
    # Asked per class: isinstance against redis-py's client classes goes through typing's
    # protocol check on every call.
    return issubclass(kind, Pipeline)


async def arun_script(
    name: str, client: Any, keys: Keys = (), args: Sequence[Any] = (), *, package: str = OURS
) -> Any:
    """``run_script`` for a ``redis.asyncio`` client (one round trip).

    On an async pipeline the call is queued (the pipeline loads missing
    scripts before it runs) and the pipeline is returned.
    """
    script, sha = _evalsha_of(name, package)
    if isinstance(client, AsyncPipeline):
        client.scripts.add(script)
        return client.execute_command("EVALSHA", sha, len(keys), *keys, *args)
    try:
        return await client.execute_command("EVALSHA", sha, len(keys), *keys, *args)
    except NoScriptError:
        await client.script_load(script.script)
        return await client.execute_command("EVALSHA", sha, len(keys), *keys, *args)
