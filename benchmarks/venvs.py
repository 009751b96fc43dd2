"""The systems the suite measures, and the virtual environment each peer runs in.

The peers cannot share one environment: arq 0.28 needs redis-py < 6, SAQ's ``redis``
extra redis-py < 8, taskiq-redis 1.2 redis-py >= 8, and streaq uses coredis. So each
peer gets a virtual environment of its own, made on first use with ``python -m venv``
and pip from the pinned requirements below, then reused. Its directory name carries a
hash of the requirements, so changing a pin makes a fresh one. The default home is
``benchmarks/results/.peers/`` (git-ignored with the results);
``FAIRLANE_BENCH_PEERS_DIR`` or the ``peers_dir`` option moves it.

Fairlane gets one too (``fairlane_env="own"``, the default but for ``--quick``): this
checkout installed editable, so the environment runs the code as it is now, with its
runtime dependencies pinned at the versions the suite's environment holds (the lock), and
nothing of the development extra. The development environment also holds, for instance,
the OpenTelemetry SDK, which Redis' client imports when it finds it: a worker there
imports more than a user's would (``benchmarks/imports.py`` counts it). With
``fairlane_env="suite"`` Fairlane runs with the interpreter that runs the suite.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from collections.abc import Callable
from dataclasses import dataclass, replace
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

SUITE = Path(__file__).resolve().parent
CHECKOUT = SUITE.parent
#: what the Fairlane driver needs beyond the library (the upstream scenario's client)
FAIRLANE_BENCH_EXTRAS = ("httpx",)
DRIVERS = SUITE / "peers"
DEFAULT_PEERS_DIR = SUITE / "results" / ".peers"
PEERS_DIR_ENV = "FAIRLANE_BENCH_PEERS_DIR"
_READY = ".fairlane-bench-ready"


@dataclass(frozen=True, slots=True)
class System:
    name: str
    label: str
    driver: str
    #: what pip installs into the system's own environment; empty: the suite's Python
    requirements: tuple[str, ...] = ()

    @property
    def driver_path(self) -> Path:
        return DRIVERS / self.driver


SYSTEMS: dict[str, System] = {
    s.name: s
    for s in (
        System("fairlane", "Fairlane", "fairlane_driver.py"),
        System(
            "arq",
            "arq",
            "arq_driver.py",
            ("arq==0.28.0", "redis==5.3.1", "hiredis==3.5.0", "uvloop==0.23.0"),
        ),
        System(
            "saq",
            "SAQ",
            "saq_driver.py",
            (
                "saq[redis,hiredis]==0.26.4",
                "redis==7.4.1",
                "hiredis==3.5.0",
                # saq 0.26.4 imports typing_extensions without declaring it
                "typing-extensions==4.16.0",
                "uvloop==0.23.0",
            ),
        ),
        System(
            "streaq",
            "streaq",
            "streaq_driver.py",
            ("streaq==7.2.0", "coredis==6.9.0", "anyio==4.16.0", "uvloop==0.23.0"),
        ),
        System(
            "taskiq",
            "taskiq-redis",
            "taskiq_driver.py",
            (
                "taskiq-redis==1.2.4",
                "taskiq==0.13.0",
                "redis==8.1.0",
                "hiredis==3.5.0",
                "uvloop==0.23.0",
            ),
        ),
    )
}
PEERS: tuple[str, ...] = ("arq", "saq", "streaq", "taskiq")


def _pinned_closure(roots: tuple[tuple[str, frozenset[str]], ...]) -> dict[str, str]:
    """Name -> version, as installed here, of every distribution ``roots`` (name, extras)
    need at run time, the roots included ('' for one not installed here)."""
    pins: dict[str, str] = {}
    todo = list(roots)
    seen: set[tuple[str, frozenset[str]]] = set()
    while todo:
        name, extras = todo.pop()
        if (canonicalize_name(name), extras) in seen:
            continue
        seen.add((canonicalize_name(name), extras))
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            pins[canonicalize_name(name)] = ""  # not here to copy: pip chooses its version
            continue
        pins[canonicalize_name(dist.metadata["Name"])] = dist.version
        for raw in dist.requires or ():
            req = Requirement(raw)
            wanted = extras or frozenset({""})
            if req.marker and not any(req.marker.evaluate({"extra": e}) for e in wanted):
                continue
            todo.append((req.name, frozenset(req.extras)))
    return pins


def fairlane_requirements() -> tuple[str, ...]:
    """What pip installs for Fairlane's own environment: this checkout, editable, and its
    run-time dependencies (with the driver's extras) at the versions installed here."""
    roots = (("fairlane", frozenset()), *((n, frozenset()) for n in FAIRLANE_BENCH_EXTRAS))
    pins = _pinned_closure(roots)
    pins.pop("fairlane", None)
    wanted = (f"{n}=={v}" if v else n for n, v in sorted(pins.items()))
    return (*wanted, "-e", str(CHECKOUT))


def own_system(name: str) -> System:
    """``name``'s system with the requirements of its own environment (Fairlane's are
    computed: ``fairlane_requirements``)."""
    system = SYSTEMS[name]
    if name == "fairlane":
        return replace(system, requirements=fairlane_requirements())
    return system


def peers_dir(override: str | Path | None = None) -> Path:
    return Path(override or os.environ.get(PEERS_DIR_ENV) or DEFAULT_PEERS_DIR)


def venv_dir(system: System, root: str | Path | None = None) -> Path:
    digest = hashlib.sha256("\n".join(system.requirements).encode()).hexdigest()[:10]
    return peers_dir(root) / f"{system.name}-{digest}"


def _python(env: Path) -> Path:
    return env / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def ready_python(name: str, root: str | Path | None = None, *, own: bool = False) -> Path | None:
    """The Python of ``name``'s environment if it is already made, else None (``own``:
    Fairlane's own environment rather than the suite's interpreter)."""
    system = own_system(name) if own else SYSTEMS[name]
    if not system.requirements:
        return Path(sys.executable)
    env = venv_dir(system, root)
    return _python(env) if (env / _READY).is_file() and _python(env).exists() else None


def ensure(
    name: str,
    root: str | Path | None = None,
    say: Callable[[str], None] | None = None,
    *,
    own: bool = False,
) -> Path:
    """The Python of ``name``'s environment, made (venv + pip, pinned) if it is not yet."""
    found = ready_python(name, root, own=own)
    if found is not None:
        return found
    system = own_system(name) if own else SYSTEMS[name]
    env = venv_dir(system, root)
    if say:
        pins = " ".join(system.requirements)
        say(f"making the {system.label} environment in {env} (once): {pins}")
    env.parent.mkdir(parents=True, exist_ok=True)
    venv.EnvBuilder(with_pip=True, clear=True).create(env)
    log = env / "install.log"
    with log.open("w") as out:
        done = subprocess.run(
            [
                str(_python(env)),
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "--no-input",
                *system.requirements,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            check=False,
        )
    if done.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
        raise RuntimeError(f"pip could not install the {system.label} environment:\n{tail}")
    (env / _READY).write_text("\n".join(system.requirements) + "\n")
    return _python(env)
