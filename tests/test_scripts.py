"""The Lua scripts: documented, cluster-safe, loaded once and reloaded after a flush."""

from __future__ import annotations

import re
from importlib import resources

import pytest

from django_rcoord.connection import slot_pipeline
from django_rcoord.scripts import get_script, run_script

LUA_FILES = [
    (package, entry.name.removesuffix(".lua"))
    for package in ("django_rcoord", "example_project")
    for entry in resources.files(package).joinpath("lua").iterdir()
    if entry.name.endswith(".lua")
]
# "_name.lua" files are helpers scripts include ("--! include _name"), not scripts.
SCRIPTS = [(package, name) for package, name in LUA_FILES if not name.startswith("_")]
HELPERS = [(package, name) for package, name in LUA_FILES if name.startswith("_")]


def source(package: str, name: str) -> str:
    return (resources.files(package) / "lua" / f"{name}.lua").read_text()


def script_text(name: str, package: str) -> str:
    """The text ``get_script`` loads for ``name``, its includes expanded."""
    script = get_script(name, package).script
    assert isinstance(script, bytes)
    return script.decode()


def test_scripts_are_found() -> None:
    names = {name for _, name in SCRIPTS}
    assert {"lock_acquire", "semaphore_acquire", "ratelimit_hit", "market_purchase"} <= names


@pytest.mark.parametrize(("package", "name"), SCRIPTS)
def test_each_script_has_a_header_naming_keys_args_and_return(package: str, name: str) -> None:
    header = [line for line in source(package, name).splitlines() if line.startswith("--")]
    text = "\n".join(header)
    assert "KEYS[1]" in text, name
    assert "Returns" in text, name


#: A redis.call's first argument, and the name it starts from: KEYS[...], or a key table's
#: entry (``group.results``, ``queues[index].ready``).
REDIS_CALL = re.compile(r"redis\.call\('(\w+)',\s*([^,)]+)")
#: A table of keys: ``name = { part = KEYS[...], ... }`` (or ``name[...] = {...}``).
TABLE = re.compile(r"(\w+)(?:\[[^\]]*\])?\s*=\s*\{([^{}]*)\}")


def key_tables(code: str) -> set[str]:
    """The tables a script fills with nothing but its KEYS, by name (``group``, ``queues``)."""
    tables = set()
    for name, body in TABLE.findall(code):
        values = [entry.split("=", 1)[-1].strip() for entry in body.split(",") if entry.strip()]
        if values and all(value.startswith("KEYS[") for value in values):
            tables.add(name)
    return tables


def base(argument: str) -> str:
    """The name an argument starts from: ``queues`` for ``queues[index].ready``."""
    match = re.match(r"\w+", argument.strip())
    return match[0] if match else argument


def without_comments(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("--"))


#: A local holding a built key: ``local key = records .. id``.
BUILT = re.compile(r"^\s*local (\w+) = ([^\n]+?)\s*\.\.", re.MULTILINE)
#: A header line naming a key the file builds: ``-- Builds   KEYS[6] .. <task id>: ...``.
BUILDS = re.compile(r"^-- Builds\s+(\S+) \.\. ", re.MULTILINE)
#: What a key may be built from: a declared key's name (``KEYS[6]``, ``group.records``, a
#: helper's parameter), nothing computed.
DECLARED = re.compile(r"[\w.]+(\[[\w +]+\])?\Z")


def header_of(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if line.startswith("--"))


def key_of(argument: str, built: dict[str, str]) -> tuple[str, bool]:
    """The declared key a redis.call's first argument names, and whether the call builds a
    key from it (``prefix .. id``, inline or through a local)."""
    argument = argument.strip()
    if ".." in argument:
        return argument.split("..", 1)[0].strip(), True
    if argument in built:
        return built[argument], True
    return argument, False


def key_problems(name: str, text: str, allowed: set[str] | None = None) -> list[str]:
    """What in Lua source ``text`` touches a key other than through its KEYS (``allowed``:
    the names keys may come from; by default KEYS and the tables holding only KEYS): each
    key is one of them, or built as one of them ``..`` something, and then the header
    names what it builds (DESIGN rule 3: a built key shares its prefix's slot)."""
    code = without_comments(text)
    allowed = allowed or {"KEYS", *key_tables(code)}
    built = dict(BUILT.findall(code))
    named = BUILDS.findall(header_of(text))
    problems = []
    for call in REDIS_CALL.finditer(code):
        command, first = call.groups()
        if command.upper() == "TIME":
            continue
        declared, builds = key_of(first, built)
        if base(declared) not in allowed or (builds and not DECLARED.match(declared)):
            problems.append(f"{name}: {call[0]} (not a declared key, nor built from one)")
        elif builds and not named:
            problems.append(f"{name}: {call[0]} (builds a key its header does not name)")
    return problems


@pytest.mark.parametrize(("package", "name"), SCRIPTS)
def test_scripts_touch_keys_only_through_keys(package: str, name: str) -> None:
    """A key built inside a script could sit in another cluster slot: every key it names is
    one of its KEYS, directly or through a table holding nothing but KEYS, or is built from
    one as a prefix (``KEYS[6] .. id``), named in its header. A script whose helpers build a
    key names it in its own header too, and from one of its KEYS."""
    assert key_problems(name, source(package, name)) == []
    expanded = without_comments(script_text(name, package))
    helpers_build = any(
        key_of(call[2], dict(BUILT.findall(expanded)))[1] for call in REDIS_CALL.finditer(expanded)
    )
    named = BUILDS.findall(header_of(source(package, name)))
    assert bool(named) is helpers_build, f"{name}: its header's 'Builds' lines: {named}"
    assert all(key.startswith("KEYS[") for key in named), name


def test_a_key_built_any_other_way_fails_the_check() -> None:
    header = "-- KEYS[1]  a record prefix\n-- Builds   KEYS[1] .. <id>: a record\n"
    allowed = header + (
        "local group = {records = KEYS[1]}\nlocal key = KEYS[1] .. ARGV[1]\n"
        "redis.call('HGET', key, 's')\nredis.call('DEL', group.records .. ARGV[1])\n"
    )
    assert key_problems("allowed", allowed) == []
    for other_way in (
        "redis.call('GET', 'rcoord:queue:{main}:r:' .. ARGV[1])",  # a literal prefix
        "redis.call('GET', ARGV[1] .. ':r')",  # an argument
        "local key = ARGV[1] .. 'x'\nredis.call('GET', key)",
        "local key = string.format('%s:%s', KEYS[1], ARGV[1])\nredis.call('GET', key)",
        "redis.call('GET', string.upper(KEYS[1]) .. ARGV[1])",  # computed, not declared
        "redis.call('GET', ARGV[1])",
    ):
        assert key_problems("other", header + other_way), other_way
    # Built from a declared key, but its header does not say so (however it is spaced).
    for unnamed in ("KEYS[1] .. ARGV[1]", "KEYS[1]..ARGV[1]"):
        assert key_problems("unnamed", f"-- KEYS[1]  a prefix\nredis.call('GET', {unnamed})")
    assert key_problems("unnamed", "local key = KEYS[1]..ARGV[1]\nredis.call('GET', key)")


def test_key_tables_hold_only_keys() -> None:
    code = "local group = {\n    messages = KEYS[1], owners = KEYS[2],\n}\n"
    code += (
        "queues[index] = {\n    ready = KEYS[first + 1],\n}\nlocal t = {a = KEYS[1], b = ARGV[1]}"
    )
    assert key_tables(code) == {"group", "queues"}


def test_included_helpers_touch_keys_only_through_keys_their_callers_pass() -> None:
    assert HELPERS, "the ready-queue helper is shared by several scripts"
    for package, helper in HELPERS:
        code = without_comments(source(package, helper))
        functions = dict(re.findall(r"local function (\w+)\(([^)]*)\)", code))
        parameters = {name.strip() for names in functions.values() for name in names.split(",")}
        key_parameters = set()
        assert key_problems(helper, source(package, helper), parameters | {"KEYS"}) == []
        built = dict(BUILT.findall(code))
        for call in REDIS_CALL.finditer(code):
            key_parameters.add(base(key_of(call[2], built)[0]))
        for package_, name in SCRIPTS:
            # "--! include _name" in its own package, "--! include package:_name" elsewhere.
            qualifier = "" if package_ == package else f"{package}:"
            if f"--! include {qualifier}{helper}\n" not in source(package_, name):
                continue
            script = script_text(name, package_)
            # The helper's own text is in the script (with what it includes, above it).
            assert "--! include" not in script
            for part in INCLUDE_LINE.split(source(package, helper)):
                assert part.strip() in script, f"{name}: {helper}"
            # Every key a helper is given is one of the script's KEYS, or a table of them.
            caller = without_comments(source(package_, name))
            allowed = {"KEYS", *key_tables(caller)}
            for function, names in functions.items():
                arguments = [argument.strip() for argument in names.split(",")]
                positions = [i for i, arg in enumerate(arguments) if arg in key_parameters]
                for call in re.finditer(rf"\b{function}\(([^)]*)\)", caller):
                    passed = [argument.strip() for argument in call[1].split(",")]
                    assert all(base(passed[i]) in allowed for i in positions), call[0]


INCLUDE_LINE = re.compile(r"^--! include .*$", re.MULTILINE)
INCLUDE = re.compile(r"^--! include (?:([\w.]+):)?(\w+)$", re.MULTILINE)
#: A top-level definition of a file: ``local function name(`` or ``local NAME =``.
DEFINITION = re.compile(r"^local (?:function )?(\w+)\b", re.MULTILINE)


def definitions(package: str, name: str) -> set[str]:
    return set(DEFINITION.findall(without_comments(source(package, name))))


def included(package: str, name: str) -> set[tuple[str, str]]:
    """The helpers a file includes, itself and through them (what precedes its text)."""
    found: set[tuple[str, str]] = set()
    todo = [(package, name)]
    while todo:
        including = todo.pop()
        for helper_package, helper in INCLUDE.findall(source(*including)):
            helper_of = (helper_package or including[0], helper)
            if helper_of not in found:
                found.add(helper_of)
                todo.append(helper_of)
    return found


@pytest.mark.parametrize(("package", "name"), LUA_FILES)
def test_each_file_includes_the_helpers_whose_names_it_uses(package: str, name: str) -> None:
    """A helper says what it needs by including it, not in prose: no caller has to know
    what to include before it, or in which order."""
    code = without_comments(source(package, name))
    mine = definitions(package, name)
    reachable = set().union(*(definitions(*helper) for helper in included(package, name)))
    for helper_package, helper in HELPERS:
        if (helper_package, helper) == (package, name):
            continue
        for defined in definitions(helper_package, helper) - mine:
            if re.search(rf"(?<![\w.]){defined}\b", code):
                assert defined in reachable, f"{name} uses {helper}'s {defined}, not included"


def test_a_helper_included_twice_is_spliced_once() -> None:
    """task_finish includes _records, and so do _finish, _metrics and _take: one copy."""
    text = script_text("task_finish", "django_rcoord")
    assert text.count("local function parse_state(") == 1
    assert text.count("local function take_tasks(") == 1
    assert text.index("local function parse_state(") < text.index("local function take_tasks(")


def test_one_script_object_per_name_and_reload_after_flush(redis_client) -> None:
    assert get_script("ratelimit_hit") is get_script("ratelimit_hit")
    key = "rcoord:test:{x}:window"
    assert run_script("ratelimit_hit", redis_client, keys=[key], args=[1000])[0] == 1
    redis_client.script_flush()
    assert run_script("ratelimit_hit", redis_client, keys=[key], args=[1000])[0] == 2


def test_scripts_run_in_a_pipeline(redis_client) -> None:
    redis_client.script_flush()  # the pipeline loads the script before it runs
    with slot_pipeline(redis_client, "rcoord:test:{p}:window") as pipe:
        run_script("ratelimit_hit", pipe, keys=["rcoord:test:{p}:window"], args=[1000])
        run_script("ratelimit_hit", pipe, keys=["rcoord:test:{p}:window"], args=[1000])
        results = pipe.execute()
    assert [hits for hits, _ in results] == [1, 2]
