"""Reading README.md's code blocks, and running its Python ones as a reader would.

The README's examples are written as a reader types them into an async Python prompt
(``python -m asyncio``): top-level ``await``, blocks of one section (``##`` or ``###``)
building on each other, an app named once and then used. ``sections`` reads them out of
the file (never a copy), with the hidden notes the README puts before a block in an HTML
comment, which a rendered README does not show:

``<!-- readme-test: setup`` ... ``-->``
    Python run before the block: the names a fragment uses without defining them
    (``doc``, a task), kept out of the reader's way.
``<!-- readme-test: file NAME -->``
    before a non-Python block: its text is written to ``NAME`` in the working
    directory, so that the example naming that file reads the README's own text.
``<!-- readme-test: worker -->``
    a worker runs while the block runs: the section's definitions (its statements
    with no ``await``: imports, the app, its tasks) are run again in a namespace of
    their own, as ``fairlane worker module:app`` would import them, and that app's
    worker serves every lane its tasks use.

``run_section`` runs one section's Python blocks statement by statement in one
namespace. Before the first statement that awaits, an ``App`` bound to ``app`` that is
not connected yet is connected, as the README says: its examples run inside
``async with app:``.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import re
import types
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fairlane import App
from fairlane.app.worker import Worker

README = Path(__file__).resolve().parents[2] / "README.md"
MARKER = "<!-- readme-test:"
_FENCE = re.compile(r"^```(\S*)\s*$")
_HEADING = re.compile(r"^#{2,3} (.+?)\s*$")
#: the module the examples are run as, as if a reader had saved them in readme.py
MODULE = "readme"
#: how long a worker may take to stop once its block is done
STOP_TIMEOUT = 15.0


@dataclass
class Block:
    lang: str
    code: str
    line: int  # the README's line of the block's first line of code
    setup: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    worker: bool = False


@dataclass
class Section:
    title: str
    blocks: list[Block] = field(default_factory=list)

    @property
    def python(self) -> list[Block]:
        return [block for block in self.blocks if block.lang == "python"]


def _apply(note: str, block: Block) -> None:
    head, _, body = note.partition("\n")
    words = head.split()
    kind = words[0] if words else ""
    if kind == "setup":
        block.setup.append(body)
    elif kind == "file" and len(words) == 2:
        block.files.append(words[1])
    elif kind == "worker" and len(words) == 1:
        block.worker = True
    else:
        raise ValueError(f"README.md: unknown readme-test note {note!r}")


def sections(text: str | None = None) -> list[Section]:
    """The README's ``##`` and ``###`` sections, their fenced blocks and the notes before them."""
    lines = (README.read_text(encoding="utf-8") if text is None else text).splitlines()
    found: list[Section] = [Section("(top)")]
    notes: list[str] = []
    index = 0
    while index < len(lines):
        line = lines[index]
        fence = _FENCE.match(line)
        if fence:
            start = index + 1
            index = start
            while index < len(lines) and lines[index].rstrip() != "```":
                index += 1
            if index == len(lines):
                raise ValueError(f"README.md:{start}: a code block is not closed")
            block = Block(fence.group(1), "\n".join(lines[start:index]) + "\n", start + 1)
            for note in notes:
                _apply(note, block)
            notes.clear()
            found[-1].blocks.append(block)
        elif line.startswith(MARKER):
            rest = line[len(MARKER) :]
            chunk = [rest]
            while "-->" not in chunk[-1]:
                index += 1
                if index == len(lines):
                    raise ValueError("README.md: a readme-test note is not closed")
                chunk.append(lines[index])
            chunk[-1] = chunk[-1][: chunk[-1].index("-->")]
            notes.append("\n".join(chunk).strip(" "))
        elif line.strip():
            if notes:
                raise ValueError(f"README.md:{index + 1}: a readme-test note must precede a block")
            heading = _HEADING.match(line)
            if heading:
                found.append(Section(heading.group(1)))
        index += 1
    return [section for section in found if section.blocks]


def _awaits(node: ast.AST) -> bool:
    """Whether a top-level statement awaits (outside the functions it defines)."""
    if isinstance(node, ast.Await | ast.AsyncWith | ast.AsyncFor):
        return True
    if isinstance(node, ast.Lambda):
        return False
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        # its decorators and defaults run when it is defined; its body does not
        defaults = [*node.args.defaults, *(d for d in node.args.kw_defaults if d is not None)]
        return any(_awaits(part) for part in [*node.decorator_list, *defaults])
    return any(_awaits(child) for child in ast.iter_child_nodes(node))


def statements(code: str, line: int) -> list[ast.stmt]:
    tree = ast.parse(code, filename=str(README))
    ast.increment_lineno(tree, line - 1)
    return tree.body


async def execute(node: ast.stmt, namespace: dict[str, Any]) -> None:
    """Run one statement in ``namespace``, top-level ``await`` allowed (as the asyncio REPL)."""
    code = compile(
        ast.Module(body=[node], type_ignores=[]),
        str(README),
        "exec",
        flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT,
        dont_inherit=True,  # not this module's `from __future__ import annotations`
    )
    outcome = types.FunctionType(code, namespace)()
    if inspect.iscoroutine(outcome):
        await outcome


def definitions(section: Section, upto: Block) -> Iterator[tuple[str, int]]:
    """The setup and the non-awaiting statements of ``section``'s Python blocks up to
    ``upto``: what a module holding them would run when a worker imports it."""
    for block in section.python:
        for setup in block.setup:
            yield setup, 1
        for node in statements(block.code, block.line):
            if not _awaits(node):
                yield ast.unparse(node) + "\n", node.lineno
        if block is upto:
            return


@asynccontextmanager
async def worker_for(section: Section, block: Block) -> AsyncIterator[Worker]:
    # the same module name: a task's name is its module's and its function's
    namespace: dict[str, Any] = {"__name__": MODULE}
    for code, line in definitions(section, block):
        for node in statements(code, line):
            await execute(node, namespace)
    app = namespace.get("app")
    if not isinstance(app, App):
        raise AssertionError(f"README.md:{block.line}: a worker needs the section's `app`")
    await app.connect()
    worker = Worker(app, lanes=sorted(app.registry.lanes_used()), concurrency=4)
    running = asyncio.create_task(worker.run(), name="readme-worker")
    try:
        yield worker
    finally:
        worker.stop()
        try:
            await asyncio.wait_for(running, STOP_TIMEOUT)
        finally:
            await app.aclose()


def _seen(namespace: dict[str, Any], apps: list[App]) -> None:
    apps.extend(
        value for value in namespace.values() if isinstance(value, App) and value not in apps
    )


async def _run_block(block: Block, namespace: dict[str, Any], apps: list[App]) -> None:
    for setup in block.setup:
        for node in statements(setup, 1):
            await execute(node, namespace)
            _seen(namespace, apps)
    for node in statements(block.code, block.line):
        app = namespace.get("app")
        if (
            isinstance(app, App)
            and not app.sharded.connected
            and _awaits(node)
            and not isinstance(node, ast.AsyncWith)
        ):
            await app.connect()
        await execute(node, namespace)
        _seen(namespace, apps)


async def run_section(section: Section) -> set[str]:
    """Run ``section``'s Python blocks in one namespace; the names of the apps it made.

    The files its blocks are noted with (``file NAME``) are already written.
    """
    namespace: dict[str, Any] = {"__name__": MODULE}
    apps: list[App] = []
    try:
        for block in section.python:
            if block.worker:
                async with worker_for(section, block):
                    await _run_block(block, namespace, apps)
            else:
                await _run_block(block, namespace, apps)
    finally:
        for app in apps:
            if app.sharded.connected:
                await app.aclose()
    return {app.name for app in apps}
