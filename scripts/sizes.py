"""Measures the house's sizes in code lines, the way its size rule reads them.

    .venv/bin/python scripts/sizes.py [--rev REV] [--top N] [SRC_DIR]

A code line is a line that holds a token of code: blank lines, comments and docstrings
(the string that is the first statement of a module, a class or a function) do not
count, so that a proof or a contract written beside its code costs nothing. A string
that spans lines counts every line it spans, unless it is a docstring.

The rule (``tests/architecture/test_sizes.py`` holds the tree to it):

* a module holds at most 400 code lines;
* a class at most 250, from its ``class`` line to its last line;
* a function's body at most 60, from its first statement to its last line (the
  signature and the decorators aside); a nested function counts in the function that
  holds it, and again on its own.

SRC_DIR (default ``src/fairlane``) is the package to measure; with ``--rev`` the files
are read from that git revision instead of the working tree. Prints the largest
modules, classes and functions, and every offender with its count and its limit.
"""

from __future__ import annotations

import argparse
import ast
import io
import subprocess
import tokenize
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

LIMITS = {"module": 400, "class": 250, "function": 60}
_NOT_CODE = frozenset(
    {
        tokenize.COMMENT,
        tokenize.NL,
        tokenize.NEWLINE,
        tokenize.INDENT,
        tokenize.DEDENT,
        tokenize.ENCODING,
        tokenize.ENDMARKER,
    }
)
_Scope = ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef


@dataclass(frozen=True, order=True)
class Size:
    """One measured module, class or function: its code lines against its limit."""

    lines: int
    kind: str
    name: str

    @property
    def limit(self) -> int:
        return LIMITS[self.kind]

    @property
    def over(self) -> bool:
        return self.lines > self.limit

    def __str__(self) -> str:
        return f"{self.kind} {self.name}: {self.lines} code lines (limit {self.limit})"


def _docstring_lines(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if not isinstance(node, _Scope) or not node.body:
            continue
        first = node.body[0]
        if (
            isinstance(first, ast.Expr)
            and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)
        ):
            lines.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    return lines


def code_lines(source: str, tree: ast.Module | None = None) -> set[int]:
    """The numbers of the lines of ``source`` that hold code (1-based)."""
    tree = tree if tree is not None else ast.parse(source)
    lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in _NOT_CODE:
            lines.update(range(token.start[0], token.end[0] + 1))
    return lines - _docstring_lines(tree)


def _scopes(
    node: ast.AST, prefix: str
) -> Iterator[tuple[str, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every class and function below ``node``, named by the scopes that hold it."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            name = f"{prefix}{child.name}"
            yield name, child
            yield from _scopes(child, f"{name}.")
        else:
            yield from _scopes(child, prefix)


def measure_source(source: str, module: str) -> list[Size]:
    """The sizes of one module's source, its classes and functions named under ``module``."""
    tree = ast.parse(source)
    code = code_lines(source, tree)
    sizes = [Size(len(code), "module", module)]
    for name, node in _scopes(tree, ""):
        end = node.end_lineno or node.lineno
        if isinstance(node, ast.ClassDef):
            span = range(node.lineno, end + 1)
            sizes.append(Size(len(code.intersection(span)), "class", f"{module}:{name}"))
        else:
            span = range(node.body[0].lineno, end + 1)
            sizes.append(Size(len(code.intersection(span)), "function", f"{module}:{name}"))
    return sizes


def measure_tree(root: Path) -> list[Size]:
    """Every module below ``root`` as it is in the working tree."""
    sizes: list[Size] = []
    for path in sorted(root.rglob("*.py")):
        sizes.extend(measure_source(path.read_text(), str(path.relative_to(root))))
    return sizes


def measure_rev(root: Path, rev: str) -> list[Size]:
    """Every module below ``root`` as it was at the git revision ``rev``."""

    def git(*args: str, cwd: Path) -> str:
        return subprocess.run(
            ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
        ).stdout

    top = Path(git("rev-parse", "--show-toplevel", cwd=root).strip())
    prefix = root.resolve().relative_to(top).as_posix()
    sizes: list[Size] = []
    for path in sorted(git("ls-tree", "-r", "--name-only", rev, "--", prefix, cwd=top).split()):
        if path.endswith(".py"):
            source = git("show", f"{rev}:{path}", cwd=top)
            sizes.extend(measure_source(source, path.removeprefix(prefix + "/")))
    return sizes


def offenders(sizes: Iterable[Size]) -> list[Size]:
    return sorted((s for s in sizes if s.over), reverse=True)


def table(sizes: list[Size], top: int) -> str:
    """The ``top`` largest of each kind, and the offenders."""
    out = []
    for kind, limit in LIMITS.items():
        of_kind = sorted((s for s in sizes if s.kind == kind), reverse=True)
        over = sum(s.over for s in of_kind)
        plural = "classes" if kind == "class" else f"{kind}s"
        out.append(f"{plural}: {len(of_kind)}, over {limit}: {over}; largest:")
        out.extend(f"  {s.lines:5} {s.name}" for s in of_kind[:top])
    out.append(f"offenders: {len(offenders(sizes))}")
    out.extend(f"  {s}" for s in offenders(sizes))
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", nargs="?", default="src/fairlane")
    parser.add_argument("--rev", help="read the files from this git revision")
    parser.add_argument("--top", type=int, default=10)
    args = parser.parse_args()
    root = Path(args.src)
    print(table(measure_rev(root, args.rev) if args.rev else measure_tree(root), args.top))


if __name__ == "__main__":
    main()
