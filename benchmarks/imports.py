"""A worker's import, counted in instructions by callgrind: the part of its start-up
that is Fairlane's to cut, as a figure that does not move with the machine.

A worker spawned to take a job spends nearly all of its start-up importing (the
``startup`` phase of ``fairlane bench`` times the whole, spawn to first job, beside the
peers). This counts, each in a fresh interpreter under ``valgrind --tool=callgrind``
with the modules' bytecode written first:

* ``interpreter``: ``python -c pass``;
* ``bench worker``: importing the benchmark's worker (``benchmarks.fairlane_worker``:
  Fairlane, Redis' client, its declarations), what the ``startup`` phase spawns;
* ``fairlane worker``: the command line as ``fairlane worker --help`` runs it (the
  worker command and its options, not a worker);
* ``dependencies``: Redis' client, pydantic and the rest of what Fairlane imports,
  without Fairlane: the floor under the two above (pydantic-settings was in it until
  Fairlane stopped importing it).

The same module measures another checkout: put that checkout's ``src`` first on
``PYTHONPATH``.

Run: ``python -m benchmarks.imports``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys

__all__ = ["PROBES", "count", "main", "probe_environment"]

_WORKER_COMMAND = """
import contextlib, io, sys
sys.argv = ["fairlane", "worker", "--help"]
from fairlane.cli import main
with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
    main()
"""

#: what each figure runs, as ``python -c`` source
PROBES: dict[str, str] = {
    "interpreter": "pass",
    "dependencies": (
        "import redis.asyncio, msgspec, cronsim, psutil, hiredis\n"
        "from pydantic import BaseModel, TypeAdapter\n"
        "try:\n    import opentelemetry.trace\nexcept ImportError:\n    pass"
    ),
    "bench worker": "import benchmarks.fairlane_worker",
    "fairlane worker": _WORKER_COMMAND,
}

_COLLECTED = re.compile(r"Collected : (\d+)")


def probe_environment() -> dict[str, str]:
    # as the startup phase does: a deployed worker imports compiled bytecode
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), here]))
    return env


def count(source: str) -> int:
    """The instructions ``python -c source`` runs, its bytecode written beforehand."""
    env = probe_environment()
    subprocess.run([sys.executable, "-c", source], env=env, check=True, timeout=120)
    grind = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"]
    done = subprocess.run(
        [*grind, sys.executable, "-c", source],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    found = _COLLECTED.search(done.stderr)
    if found is None:
        raise RuntimeError(f"callgrind printed no count:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--probe", action="append", choices=sorted(PROBES), help="default: all")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (it comes with the system's packages)")
    for name in args.probe or list(PROBES):
        print(f"{name:16} {count(PROBES[name]) / 1e6:9.1f}M instructions", flush=True)


if __name__ == "__main__":
    main()
