"""No dead code: every module-level function, class and constant of ``forklab/`` is used
somewhere in ``forklab/``, ``tests/``, ``bench/``, ``scripts/`` or ``examples/``.

A definition of module ``M`` counts as used when ``M`` itself reads the name outside the
definition's own body, when some module imports it by name from ``M`` (or from a package
whose ``__init__`` re-exports it), when some module reads it as an attribute of ``M``
(``import forklab.x as m; m.name``), or when a string names it exactly or as the last part
of a dotted path or ``module:attribute`` reference (``REGISTRARS``' function names,
``pyproject.toml``'s entry point). Words inside docstrings and longer strings do not count:
an SQL column called like a dead helper once hid that helper.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("forklab", "tests", "bench", "scripts", "examples")
#: Files outside Python whose references count (the console script, the image's command).
OTHER_FILES = ("pyproject.toml", "Dockerfile", "Makefile", "docker-compose.yml")
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_REFERENCE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*(?::[A-Za-z_][A-Za-z0-9_]*)?$")


def _module_name(root: Path, file: Path) -> str:
    parts = list(file.relative_to(root).with_suffix("").parts)
    if parts[0] != "forklab":  # tests/x.py imports as x (the folder is on sys.path)
        parts = parts[1:]
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _docstrings(nodes: list[ast.AST]) -> set[int]:
    found: set[int] = set()
    for node in nodes:
        if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            for statement in node.body[:1]:
                if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
                    found.add(id(statement.value))
    return found


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    keep = len(parts) - node.level + (1 if is_package else 0)
    return ".".join(parts[:keep] + ([node.module] if node.module else []))


def _definitions(tree: ast.Module) -> Iterable[tuple[str, ast.stmt]]:
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            yield node.name, node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    yield target.id, node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            yield node.target.id, node


def dead_definitions(root: Path) -> list[str]:
    """``module:line name`` of every module-level definition of ``root/forklab`` that
    nothing uses (see the module's docstring for what counts as a use)."""
    trees = {
        file: ast.parse(file.read_text(), str(file))
        for folder in FOLDERS
        for file in sorted((root / folder).rglob("*.py"))
    }
    walked = {file: list(ast.walk(tree)) for file, tree in trees.items()}
    used: set[tuple[str, str]] = set()  # (module, name)
    reexports: dict[tuple[str, str], tuple[str, str]] = {}
    named: set[str] = set()  # names a string refers to
    for folder_file in OTHER_FILES:
        if (root / folder_file).is_file():
            text = (root / folder_file).read_text()
            named.update(m.group(1) for m in re.finditer(r"[.:]([A-Za-z_][A-Za-z0-9_]*)", text))
    for file, tree in trees.items():
        module = _module_name(root, file)
        package = file.name == "__init__.py"
        aliases: dict[str, str] = {}  # local name -> the dotted thing it is bound to
        docs = _docstrings(walked[file])
        for node in walked[file]:
            if isinstance(node, ast.ImportFrom):
                base = _absolute(module, package, node)
                for alias in node.names:
                    used.add((base, alias.name))
                    aliases[alias.asname or alias.name] = f"{base}.{alias.name}"
                    if package and node in tree.body:
                        reexports[(module, alias.asname or alias.name)] = (base, alias.name)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    local = alias.asname or alias.name.split(".")[0]
                    aliases[local] = alias.name if alias.asname else local
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = node.value.strip()
                if id(node) not in docs and _REFERENCE.match(text):
                    named.add(_WORD.findall(text)[-1])
        for node in walked[file]:
            if isinstance(node, ast.Attribute):
                chain: list[str] = []
                value: ast.expr = node
                while isinstance(value, ast.Attribute):
                    chain.insert(0, value.attr)
                    value = value.value
                if isinstance(value, ast.Name) and value.id in aliases:
                    parts = [*aliases[value.id].split("."), *chain]
                    used.update((".".join(parts[:i]), parts[i]) for i in range(1, len(parts)))
    for key in list(used):
        while key in reexports:
            key = reexports[key]
            used.add(key)
    dead: list[str] = []
    for file, tree in trees.items():
        if file.relative_to(root).parts[0] != "forklab":
            continue
        module = _module_name(root, file)
        reads: dict[str, list[int]] = {}
        for node in walked[file]:
            if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Store):
                reads.setdefault(node.id, []).append(id(node))
        for name, definition in _definitions(tree):
            if name.startswith("__") or (module, name) in used or name in named:
                continue
            own_body = (
                set()
                if isinstance(definition, ast.Assign | ast.AnnAssign)
                else {id(n) for n in ast.walk(definition)}
            )
            if all(read in own_body for read in reads.get(name, [])):
                dead.append(f"{module}:{definition.lineno} {name}")
    return dead


def test_nothing_in_forklab_is_defined_and_never_used() -> None:
    assert dead_definitions(ROOT) == [], (
        "defined but never used: delete them (or use them where they were meant to be used)"
    )


def test_the_scan_finds_a_planted_dead_definition(tmp_path: Path) -> None:
    package = tmp_path / "forklab"
    package.mkdir()
    (package / "__init__.py").write_text("from forklab.a import exported\n")
    (package / "a.py").write_text(
        '"""Mentions helper and CONSTANT in a docstring."""\n'
        "CONSTANT = 1\n"
        "OTHER = 2\n"
        "def helper(n):\n    return helper(n - 1) if n else 0\n"  # only calls itself
        "def exported():\n    return OTHER\n"
        "def by_name():\n    pass\n"
        "def by_attribute():\n    pass\n"
        "class Column:\n    sql = 'SELECT helper FROM t'\n"
    )
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text(
        "import forklab.a as a\nfrom forklab import exported\n"
        "REF = ('forklab.a', 'by_name')\n"
        "a.by_attribute()\n"
    )
    assert dead_definitions(tmp_path) == [
        "forklab.a:2 CONSTANT",
        "forklab.a:4 helper",
        "forklab.a:12 Column",
    ]
