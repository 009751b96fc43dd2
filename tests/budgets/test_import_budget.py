"""What ``import fairlane`` costs a worker's start-up: counts, in a fresh interpreter.

A worker spawned to take a job spends most of its start-up importing (the start-up row of
the README's Performance section). Two things made that import slow, and both are
counted here, the same in every run:

* Dataclasses. A frozen dataclass's class statement compiles five generated methods:
  about 0.5 ms a class on the test machine, and the import made 125 of them, 43 % of
  Fairlane's own import time. A ``msgspec.Struct`` is made in C, some 40 times faster,
  and behaves the same for a value type (fields, defaults, ``__post_init__``, equality,
  hashing when frozen). So Fairlane's internal value types are Structs; the types of the
  public API stay dataclasses, which a user may ``dataclasses.replace``. The budget is
  the dataclasses the import makes, as measured when it was set.
* Features a worker may not use. Prometheus' client and the metrics collectors are
  imported when a worker is given a metrics port, the process pool (and
  ``multiprocessing``) when a task or a step runs in one, the HTTP server under
  ``/health`` when it is given a health port: not with the package.
* psutil. Its import took about 20 ms (its named tuples); the built-in pressure sensors
  read procfs on Linux instead, and import it where there is none. No module of
  Fairlane's that ``import fairlane`` loads imports it at its top (a development
  environment may still load it: the OpenTelemetry SDK, which Redis' client imports
  when it is installed, does).
* pydantic-settings. Its sources and providers (the command-line and secrets ones among
  them) cost about 70 million instructions of a worker's import, a twentieth of it; the
  settings are read by Fairlane's own sources (``fairlane.config.sources``), to the same
  conventions, and the package is a development dependency only (the twin those sources
  are tested against).
* The standard library's parsers a worker seldom needs: the TOML parser (its regular
  expressions compile at import) where a configuration file is read, difflib where a
  misspelt key is named, and the release's metadata (every installed distribution looked
  at, its metadata parsed as mail headers) where a store of another layout is refused.
* The other commands. ``fairlane worker`` imports the worker command alone, not the
  command line's every module (the gateway, the simulator, the narratives of
  ``explain``): a fifth of the import of a worker started from the command line.

Lower a budget when a change lowers its count.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys

# the dataclasses ``import fairlane`` makes: the public API's, and a few more that
# documented types name (measured on the tree that set it)
DATACLASS_BUDGET = 21
# what ``import fairlane`` must leave out: each is imported by the feature that uses it
NOT_IMPORTED = (
    "prometheus_client",
    "fairlane.metrics.recorder",
    "fairlane.metrics.server",
    "fairlane.metrics.store",
    "multiprocessing",
    "fairlane.runtime.executors.process",
    "http.server",
    "fairlane.gateway",
    "fastapi",
    "typer",
    "rich",
    "pydantic_settings",
    # read where they are used: a file to parse, a misspelling to name, the layout error
    "tomllib",
    "difflib",
    "email.parser",
)

_PROBE = """
import dataclasses, json, sys
made = []
_process_class = dataclasses._process_class
def counting(cls, *args, **kwargs):
    made.append(f"{cls.__module__}.{cls.__qualname__}")
    return _process_class(cls, *args, **kwargs)
dataclasses._process_class = counting
import fairlane
print(json.dumps({
    "dataclasses": [name for name in made if name.startswith("fairlane")],
    "modules": sorted(sys.modules),
}))
"""


# what ``fairlane worker`` leaves out: the other commands and what only they use
NOT_IMPORTED_BY_THE_WORKER_COMMAND = (
    "fairlane.cli.commands",
    "fairlane.cli.gateway",
    "fairlane.cli.explain",
    "fairlane.cli.simulate",
    "fairlane.gateway",
    "fairlane.sim",
    "fairlane.insight.explain",
)

_WORKER_COMMAND = """
import contextlib, json, sys
sys.argv = ["fairlane", "worker", "--help"]
from fairlane.cli import main
with contextlib.redirect_stdout(sys.stderr), contextlib.suppress(SystemExit):
    main()
print(json.dumps(sorted(sys.modules)))
"""


def _import_fairlane() -> dict[str, list[str]]:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True, timeout=60
    )
    found: dict[str, list[str]] = json.loads(out.stdout)
    return found


def _modules_of_the_worker_command() -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", _WORKER_COMMAND],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert "Usage: fairlane worker" in out.stderr  # the command was found and its help shown
    return set(json.loads(out.stdout))


def test_the_probe_counts_the_dataclasses_it_sees() -> None:
    found = _import_fairlane()
    # ServiceClass is a public dataclass the package imports: the probe must see it
    assert "fairlane.policy.classes.ServiceClass" in found["dataclasses"]


def test_importing_fairlane_makes_few_dataclasses() -> None:
    made = _import_fairlane()["dataclasses"]
    assert len(made) <= DATACLASS_BUDGET, (
        f"import fairlane made {len(made)} dataclasses (budget {DATACLASS_BUDGET}): an "
        "internal value type can be a msgspec.Struct\n" + "\n".join(made)
    )


def test_importing_fairlane_leaves_out_what_a_worker_may_not_use() -> None:
    modules = set(_import_fairlane()["modules"])
    imported = [m for m in NOT_IMPORTED if m in modules]
    assert not imported, f"import fairlane imported {imported}"


def test_the_worker_command_imports_no_other_command() -> None:
    modules = _modules_of_the_worker_command()
    assert "fairlane.cli.worker" in modules
    imported = [m for m in NOT_IMPORTED_BY_THE_WORKER_COMMAND if m in modules]
    assert not imported, f"fairlane worker imported {imported}"


def _top_level_imports(module: str) -> set[str]:
    """The modules ``module``'s source imports outside any function or class."""
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None
    with open(spec.origin, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
    return found


def test_no_module_a_worker_imports_imports_psutil_at_its_top() -> None:
    ours = [m for m in _import_fairlane()["modules"] if m.split(".")[0] == "fairlane"]
    assert "fairlane.runtime.sensors" in ours  # the probe sees the sensors' module
    importers = [m for m in ours if "psutil" in _top_level_imports(m)]
    assert not importers, f"these import psutil when fairlane is imported: {importers}"
