"""``coding-fix``: a coding agent facing a failing test suite, and three fix strategies.

A small package, ``calc``, has a bug in ``calc/arith.py`` (``add`` returns ``a - b``, or
another wrong expression, or nothing is wrong at all); its test suite says so. The package
lives in the episode's workspace, as files. The agent runs the tests once (the prefix),
then a world applies one strategy to the files and runs the tests again:

- ``minimal``: the one-line fix an agent makes after reading the failure — turn the
  ``a - b`` on the ``return`` line into ``a + b``, and nothing else;
- ``rewrite``: rewrite the module with type checks (numbers only) and a correct ``add``;
- ``skip``: mark every test of ``add`` as an expected failure (``@unittest.expectedFailure``)
  — which backfires when one of them passes by accident (``add(0, 0) == 0`` even with the
  bug), because unittest counts an *unexpected success* as a failure of the suite.

Which bug and which tests an episode gets are seeded variants. This module is the one
source of the package's files (``package_files``), of the strategies (``apply_strategy``,
used by the agents of ``forklab demo workspace`` inside their sandboxes via ``python -m
forklab.workloads.coding_fix apply STRATEGY FOLDER``) and of the workload, which runs
the test file of its workspace with unittest in its own process (``run_suite``) and
keeps only the verdicts in its JSON state. Standard library only.
"""

from __future__ import annotations

import argparse
import io
import random
import sys
import types
import unittest
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

from forklab.runtime.crn import Shocks
from forklab.runtime.workload import Feature, State, Workload, WorkloadError

#: The expression ``add`` returns, per bug (``none``: the report was wrong, no bug).
BUGS: Mapping[str, str] = {"sub": "a - b", "mul": "a * b", "first": "a", "none": "a + b"}
#: Tests of ``add`` every variant has: (name, a, b, expected).
CORE_CASES: tuple[tuple[str, Any, Any, Any], ...] = (
    ("positive", 2, 3, 5),
    ("negative", -4, 1, -3),
    ("large", 1_000_000, 1, 1_000_001),
)
#: Tests a variant may have. Some pass by accident under some bugs (0 - 0 == 0, 2 * 2 == 4,
#: 7 - 0 == 7); ``strings`` fails under a rewrite that admits numbers only.
OPTIONAL_CASES: tuple[tuple[str, Any, Any, Any], ...] = (
    ("zero", 0, 0, 0),
    ("twos", 2, 2, 4),
    ("right_zero", 7, 0, 7),
    ("strings", "ab", "cd", "abcd"),
)
STRATEGIES = ("minimal", "rewrite", "skip")
ARITH = "calc/arith.py"
TESTS = "tests/test_arith.py"
#: What the experiment's workspace holds per episode: the package and its ``add`` tests
#: (the demo's workspace has the whole checkout, see ``package_files``), and the report
#: of the last test run, which the agent writes.
WORKLOAD_FILES = ("calc/__init__.py", ARITH, "tests/__init__.py", TESTS)
REPORT = "test-report.txt"
XFAIL = "    @unittest.expectedFailure\n"
#: The demo's variant: seed 002's bug and its accidental pass.
DEMO_CASES = (*CORE_CASES, OPTIONAL_CASES[0])

_REWRITE = '''"""Arithmetic helpers, rewritten with explicit type checks."""

from __future__ import annotations

Number = int | float


def _check(name: str, value: object) -> Number:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number, not {type(value).__name__}")
    return value


def add(a: Number, b: Number) -> Number:
    """The sum of two numbers."""
    return _check("a", a) + _check("b", b)


def sub(a: Number, b: Number) -> Number:
    return _check("a", a) - _check("b", b)


def mul(a: Number, b: Number) -> Number:
    return _check("a", a) * _check("b", b)
'''


def arith_source(bug: str) -> str:
    return (
        '"""Arithmetic helpers."""\n\n\n'
        f"def add(a, b):\n    return {BUGS[bug]}\n\n\n"
        "def sub(a, b):\n    return a - b\n\n\n"
        "def mul(a, b):\n    return a * b\n"
    )


def tests_source(cases: list[list[Any]] | tuple[tuple[str, Any, Any, Any], ...]) -> str:
    lines = [
        "import unittest\n\nfrom calc.arith import add\n\n\nclass TestAdd(unittest.TestCase):\n"
    ]
    for name, a, b, expected in cases:
        check = f"self.assertEqual(add({a!r}, {b!r}), {expected!r})"
        lines.append(f"    def test_{name}(self):\n        {check}\n\n")
    lines.append('\nif __name__ == "__main__":\n    unittest.main()\n')
    return "".join(lines)


# The rest of the package: correct code and its passing tests, so the workspace looks like
# a real checkout (about twenty files) and the other tests keep passing whatever happens.
def _test_file(module: str, name: str, call: str, expected: str) -> str:
    cls = "Test" + name.capitalize()
    return (
        f"import unittest\n\nfrom calc.{module} import {name}\n\n\n"
        f"class {cls}(unittest.TestCase):\n    def test_{name}(self):\n"
        f"        self.assertEqual({call}, {expected})\n"
    )


_FILLER: Mapping[str, str] = {
    "calc/__init__.py": (
        '"""calc: a tiny arithmetic package."""\n\nfrom calc.arith import add, mul, sub\n\n'
        '__all__ = ["add", "mul", "sub"]\n'
    ),
    "calc/fmt.py": 'def percent(x: float) -> str:\n    return f"{x:.1%}"\n',
    "calc/parse.py": "def number(text: str) -> float:\n    return float(text.strip())\n",
    "calc/stats.py": "def mean(xs: list[float]) -> float:\n    return sum(xs) / len(xs)\n",
    "calc/units.py": "def km(metres: float) -> float:\n    return metres / 1000\n",
    "calc/clamp.py": (
        "def clamp(x: float, lo: float, hi: float) -> float:\n    return max(lo, min(hi, x))\n"
    ),
    "tests/__init__.py": "",
    "tests/test_fmt.py": _test_file("fmt", "percent", "percent(0.5)", "'50.0%'"),
    "tests/test_parse.py": _test_file("parse", "number", "number(' 2.5 ')", "2.5"),
    "tests/test_stats.py": _test_file("stats", "mean", "mean([1, 2, 3])", "2"),
    "tests/test_units.py": _test_file("units", "km", "km(1500)", "1.5"),
    "tests/test_clamp.py": _test_file("clamp", "clamp", "clamp(5, 0, 3)", "3"),
    "README.md": "# calc\n\nA tiny arithmetic package. Test it: `python3 -m unittest -v`.\n",
    "pyproject.toml": '[project]\nname = "calc"\nversion = "0.1.0"\n',
    "setup.cfg": "[metadata]\nname = calc\n",
    ".gitignore": "__pycache__/\n",
    "LICENSE": "MIT License\n",
    "docs/usage.md": "```python\nfrom calc import add\nadd(2, 3)\n```\n",
    "CHANGELOG.md": "## 0.1.0\n- first release\n",
}


def package_files(bug: str, cases: tuple[tuple[str, Any, Any, Any], ...]) -> dict[str, str]:
    """The package's source files (paths relative to the workspace), sorted."""
    files = {**_FILLER, ARITH: arith_source(bug), TESTS: tests_source(cases)}
    return dict(sorted(files.items()))


def vendored_chunks(size: int, seed: int = 2, chunk: int = 1 << 20) -> Iterator[bytes]:
    """Deterministic pseudo-random bytes standing for vendored dependencies (weights,
    wheels): the same ``size`` and ``seed`` give the same bytes on every machine."""
    rng = random.Random(seed)
    left = size
    while left > 0:
        n = min(chunk, left)
        yield rng.randbytes(n)
        left -= n


# --- the strategies, as edits of file text -------------------------------------------
def apply_minimal(arith: str) -> str:
    """Turn ``return a - b`` into ``return a + b`` (the line the traceback pointed at)."""
    return arith.replace("    return a - b\n\n\ndef sub", "    return a + b\n\n\ndef sub", 1)


def apply_skip(tests: str) -> str:
    """Mark every test of ``TestAdd`` as an expected failure."""
    head, sep, body = tests.partition("class TestAdd(unittest.TestCase):\n")
    return head + sep + body.replace("    def test_", XFAIL + "    def test_")


def apply_strategy(strategy: str, files: Mapping[str, str]) -> dict[str, str]:
    """The files after ``strategy``; only ``calc/arith.py`` or the tests change."""
    out = dict(files)
    if strategy == "minimal":
        out[ARITH] = apply_minimal(files[ARITH])
    elif strategy == "rewrite":
        out[ARITH] = _REWRITE
    elif strategy == "skip":
        out[TESTS] = apply_skip(files[TESTS])
    else:
        raise ValueError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    return out


# --- unittest's verdict, in this process ---------------------------------------------------
def run_suite(folder: Path) -> dict[str, Any]:
    """Run ``tests/test_arith.py`` of ``folder`` against its ``calc/arith.py`` with unittest,
    in this process (a sandbox's runner may not start another): the names of the tests,
    those that failed or raised, and the unexpected successes (an expected failure that
    passed, which fails the suite). ``sys.modules`` is restored afterwards."""
    arith = types.ModuleType("calc.arith")
    exec(compile((folder / ARITH).read_text(), str(folder / ARITH), "exec"), arith.__dict__)
    package = types.ModuleType("calc")
    package.__path__ = []
    package.arith = arith  # type: ignore[attr-defined]
    saved = {name: sys.modules.get(name) for name in ("calc", "calc.arith")}
    sys.modules.update({"calc": package, "calc.arith": arith})
    try:
        tests = types.ModuleType("tests.test_arith")
        exec(compile((folder / TESTS).read_text(), str(folder / TESTS), "exec"), tests.__dict__)
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
    suite = unittest.defaultTestLoader.loadTestsFromModule(tests)

    def names(tests: list[Any]) -> list[str]:
        return sorted(t._testMethodName.removeprefix("test_") for t in tests)

    every = names(list(_leaves(suite)))  # before running: a suite drops its tests as it runs
    result = unittest.TextTestRunner(stream=io.StringIO(), verbosity=0).run(suite)
    return {
        "tests": every,
        "failed": names([t for t, _ in (*result.failures, *result.errors)]),
        "unexpected": names(list(result.unexpectedSuccesses)),
        "passed": result.wasSuccessful(),
    }


def _leaves(suite: unittest.TestSuite) -> Iterator[unittest.TestCase]:
    for test in suite:
        if isinstance(test, unittest.TestSuite):
            yield from _leaves(test)
        else:
            yield test


def _report(result: Mapping[str, Any]) -> str:
    verdict = "OK" if result["passed"] else "FAILED"
    return (
        f"{verdict}: {len(result['tests'])} tests; failed: {', '.join(result['failed']) or '-'}; "
        f"unexpected successes: {', '.join(result['unexpected']) or '-'}\n"
    )


class CodingFix(Workload):
    """Seeded variants of the ``calc`` package; the strategies are the interventions. The
    package is the episode's workspace; the state holds the bug's name and the verdicts."""

    name = "coding-fix"
    has_workspace = True
    default_params: ClassVar[Mapping[str, Any]] = {
        "bugs": ["sub", "sub", "mul", "first", "none"],
        "p_optional": 0.4,
    }
    interventions: ClassVar[Mapping[str, Mapping[str, Any]]] = {s: {} for s in STRATEGIES}
    feature_types: ClassVar[Mapping[str, Any]] = {
        "failing_tests": int,
        "passing_add_tests": int,
        "string_test": bool,
    }
    max_steps = 10

    def check_params(self) -> None:
        bugs = self.params["bugs"]
        if (
            not isinstance(bugs, list)
            or not bugs
            or any(not isinstance(b, str) or b not in BUGS for b in bugs)
        ):
            raise WorkloadError(
                "workload.params.bugs", f"must be a non-empty list drawn from {', '.join(BUGS)}"
            )
        p = self.params["p_optional"]
        if isinstance(p, bool) or not isinstance(p, int | float) or not 0.0 <= p <= 1.0:
            raise WorkloadError("workload.params.p_optional", "must be a probability in [0, 1]")

    def _folder(self) -> Path:
        if self.workspace is None:
            raise RuntimeError("coding-fix runs in a workspace; the runner gave it none")
        return self.workspace

    def initial_state(self, episode_seed: int, shocks: Shocks) -> State:
        r = random.Random(episode_seed)
        bug = r.choice(self.params["bugs"])
        p = self.params["p_optional"]
        cases = (*CORE_CASES, *(c for c in OPTIONAL_CASES if r.random() < p))
        files = package_files(bug, cases)
        for rel in WORKLOAD_FILES:
            (self._folder() / rel).parent.mkdir(parents=True, exist_ok=True)
            (self._folder() / rel).write_text(files[rel])
        return {"bug": bug, "runs": 0}

    def boundary(self, state: State) -> int:
        return 1  # after the agent has run the failing tests once

    def cursor(self, state: State) -> int:
        return int(state["runs"])

    def step(self, state: State, shocks: Shocks) -> None:
        """The agent runs the test suite and writes what it saw into the workspace."""
        state["result"] = run_suite(self._folder())
        (self._folder() / REPORT).write_text(_report(state["result"]))
        state["runs"] += 1

    def done(self, state: State) -> bool:
        return int(state["runs"]) >= 2

    def outcome(self, state: State) -> bool:
        return bool(state["result"]["passed"])

    def features(self, state: State) -> dict[str, Feature]:
        """What the agent saw in the first test run, before choosing a strategy."""
        result = state["result"]
        return {
            "failing_tests": len(result["failed"]),
            "passing_add_tests": len(result["tests"]) - len(result["failed"]),
            "string_test": "strings" in result["tests"],
        }

    def intervene(self, state: State, name: str, params: Mapping[str, Any], shocks: Shocks) -> None:
        """The strategy edits the files of the workspace, as the demo's agents do."""
        folder = self._folder()
        files = {p: (folder / p).read_text() for p in (ARITH, TESTS)}
        for path, text in apply_strategy(name, files).items():
            if text != files[path]:
                (folder / path).write_text(text)


def main(argv: list[str] | None = None) -> int:
    """The agent's edit inside a sandbox: ``apply STRATEGY FOLDER`` rewrites the files."""
    parser = argparse.ArgumentParser(prog="coding-fix")
    parser.add_argument("action", choices=["apply"])
    parser.add_argument("strategy", choices=STRATEGIES)
    parser.add_argument("folder", type=Path)
    args = parser.parse_args(argv)
    paths = [ARITH, TESTS]
    files = {p: (args.folder / p).read_text() for p in paths}
    for path, text in apply_strategy(args.strategy, files).items():
        if text != files[path]:
            (args.folder / path).write_text(text)
            print(f"{args.strategy}: rewrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
