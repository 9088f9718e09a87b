"""Which tests are ``durable``: the rule ``conftest.py`` marks tests by, read from the test
files' source (no import), so that ``make test-fast`` need not even import a module whose
tests all start something real.

A test is durable when it starts a server, a worker, a sandbox, a process, a database or a
mount. Two ways to see it, both from what the test names:

- a fixture in ``DURABLE_FIXTURES`` in its fixture closure (``conftest.py`` checks that at
  collection, where the closure is known);
- a name in ``PROCESS_NAMES`` in its body, or a call of a function or class of its module
  or of a helper module of this folder whose body does (``spawning_names``, followed
  through the helpers' own definitions and imports).

The rule is checked from the other side as well: in a ``make test-fast`` run a test that
starts a process anyway fails, naming the process (``conftest.py``'s audit hook), so a
test the rule misses cannot hide in the fast loop.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterable, Iterator
from pathlib import Path

TESTS = Path(__file__).resolve().parent

#: Fixtures that start something real.
DURABLE_FIXTURES = frozenset(
    {
        "temporal_env",  # the dev server
        "lab",  # a ForkLab worker on it
        "worker_processes",  # `forklab worker` processes
        "cpu",  # the worker's process pool
        "services",  # the model server and the payments/mail service (HTTP)
        "agent_lab",  # an agent worker
        "root",  # a root for overlay mounts (the layer store)
        "workspaces",
    }
)
#: Names whose use starts a process or a server: the ``forklab`` CLI as a process, a dev
#: server, a process pool, a local sandbox, PostgreSQL or the S3 server, a host script.
PROCESS_NAMES = frozenset(
    {
        "subprocess",
        "Popen",
        "multiprocessing",
        "ProcessPoolExecutor",
        "cpu_pool",
        "start_pool",
        "FORKLAB",
        "start_dev_server",
        "start_server",  # `forklab up`'s dev server, in the background
        "WorkflowEnvironment",
        "LocalSandboxBackend",
        "WorkloadCalls",  # a workload's calls, each in a confined process
        "CohortCodeCalls",  # a cohort scorer's or feature function's calls, likewise
        "confine",
        "jail",
        "twin",  # the rehearsal's twin runs the workload in a process
        "postgres_database",
        "moto_server",
        "os.fork",
        "os.system",
        "os.posix_spawn",
        "os.execv",
    }
)


#: Tests that start a process through ForkLab's own code in a way their source does not
#: name (a ``processes=2`` twin, ``plan --processes 2``, a rehearsal whose pieces fork, the
#: ``demo``/``up`` commands in-process): found by the fast run's audit hook, listed here.
STARTS_PROCESSES: dict[str, frozenset[str]] = {
    "test_boxed_rehearsal.py": frozenset(
        {
            "test_a_held_out_part_that_breaks_the_contract_answers_its_sentence",
            "test_a_part_that_is_slow_on_one_piece_leaves_the_rest_to_the_others",
            "test_the_first_failed_piece_in_order_is_answered_not_the_first_in_time",
        }
    ),
    "test_coding_agent.py": frozenset({"test_the_copy_fallback_through_the_cli"}),
    "test_engine.py": frozenset({"test_two_processes_give_identical_results"}),
    "test_up_settings.py": frozenset({"test_a_server_that_dies_at_start_is_reported_at_once"}),
    "test_workload_contract.py": frozenset(
        {"test_plan_with_two_processes_gives_the_same_sentence"}
    ),
}


def _names_in(node: ast.AST) -> Iterator[str]:
    """Every name ``node`` reads: plain names, the attribute of an ``a.b`` and, where ``a``
    is a plain name, ``a.b`` itself."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            yield sub.id
        elif isinstance(sub, ast.Attribute):
            yield sub.attr
            if isinstance(sub.value, ast.Name):
                yield f"{sub.value.id}.{sub.attr}"


def _top_level(tree: ast.Module) -> Iterator[ast.stmt]:
    """The module's statements outside function and class bodies (through ``with``,
    ``if`` and ``try`` blocks)."""
    todo: list[ast.stmt] = list(tree.body)
    while todo:
        stmt = todo.pop(0)
        yield stmt
        if isinstance(stmt, ast.With | ast.If | ast.Try):
            for field in ("body", "orelse", "finalbody", "handlers"):
                for child in getattr(stmt, field, []):
                    todo.extend(child.body if isinstance(child, ast.ExceptHandler) else [child])


def _helper(module: str) -> Path | None:
    """The file of a helper module of this folder (``orchestration_lab``,
    ``tests.sandbox_lab``), or None."""
    name = module.removeprefix("tests.")
    path = TESTS / f"{name}.py"
    return path if "." not in name and path.is_file() else None


_IN_PROGRESS: set[Path] = set()


@functools.cache
def spawning_names(path: Path) -> frozenset[str]:
    """The names bound at the top of the module at ``path`` whose use starts a process:
    its own functions and classes whose bodies use one, and names it imports from a
    helper module of this folder that are such there. Helpers that import each other
    (or themselves) are read once: a module still being read contributes nothing."""
    if path in _IN_PROGRESS:
        return frozenset()
    _IN_PROGRESS.add(path)
    try:
        return _spawning_names(path)
    finally:
        _IN_PROGRESS.discard(path)


def _spawning_names(path: Path) -> frozenset[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    spawning: set[str] = set()
    defs: dict[str, ast.AST] = {}
    for stmt in _top_level(tree):
        if isinstance(stmt, ast.ImportFrom) and stmt.module and (helper := _helper(stmt.module)):
            there = spawning_names(helper)
            spawning.update(a.asname or a.name for a in stmt.names if a.name in there)
        elif isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            defs[stmt.name] = stmt
    changed = True
    while changed:  # a function that calls a spawning function spawns too
        changed = False
        for name, node in defs.items():
            if name not in spawning and _uses(node, spawning):
                spawning.add(name)
                changed = True
    return frozenset(spawning)


def _uses(node: ast.AST, spawning: Iterable[str]) -> bool:
    names = set(_names_in(node))
    return bool(names & PROCESS_NAMES or names & set(spawning))


@functools.cache  # asked once per test item: parse each module once
def durable_functions(path: Path) -> dict[str, str]:
    """Test module ``path``'s test functions (and test classes) that are durable by their
    source, each with the reason: the process name it uses or the fixture it asks for
    (a shared dict: read it, do not change it)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    spawning = spawning_names(path)
    fixtures = _durable_local_fixtures(tree)
    found: dict[str, str] = {}
    listed = STARTS_PROCESSES.get(path.name, frozenset())
    for stmt in _top_level(tree):
        if not isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        if not stmt.name.lower().startswith("test"):
            continue
        if stmt.name in listed:
            found[stmt.name] = "starts a process through ForkLab (STARTS_PROCESSES)"
        elif stmt.name in spawning:
            used = sorted((set(_names_in(stmt)) & (PROCESS_NAMES | spawning)) - {stmt.name})
            found[stmt.name] = f"uses {used[0] if used else stmt.name}"
        elif asked := _parameters(stmt) & (DURABLE_FIXTURES | fixtures):
            found[stmt.name] = f"fixture {sorted(asked)[0]}"
    return found


def _parameters(node: ast.AST) -> set[str]:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return {a.arg for a in node.args.args + node.args.kwonlyargs}
    names: set[str] = set()
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
            names |= _parameters(child)
    return names


def _durable_local_fixtures(tree: ast.Module) -> set[str]:
    """The module's own fixtures that ask for a durable fixture or start a process."""
    spawning: set[str] = set()
    fixtures = {
        s.name: s
        for s in _top_level(tree)
        if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef)
        and any("fixture" in set(_names_in(d)) for d in s.decorator_list)
    }
    changed = True
    while changed:
        changed = False
        for name, node in fixtures.items():
            if name in spawning:
                continue
            if _parameters(node) & (DURABLE_FIXTURES | spawning) or _uses(node, spawning):
                spawning.add(name)
                changed = True
    return spawning


def wholly_durable(path: Path) -> bool:
    """Whether every test of the module at ``path`` is durable by its source (then a fast
    run need not import it)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    tests = [
        s.name
        for s in _top_level(tree)
        if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        and s.name.lower().startswith("test")
    ]
    return bool(tests) and set(tests) <= set(durable_functions(path))
