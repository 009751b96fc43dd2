"""The distributions: ``python -m build`` makes an sdist and a wheel, and the wheel runs.

``python -m build`` (without isolation: the build backend, hatchling, is in the test
environment, so nothing is downloaded) builds the sdist and then the wheel from the
unpacked sdist, so a file the sdist leaves out breaks the wheel here. The wheel must
hold every file of ``src/fairlane`` (the Lua library, the dashboard's static files,
the simulator's scenarios, ``py.typed``), and nothing else.

It is then installed with pip into a fresh virtual environment, from the file alone
(``--no-deps --no-index``): the dependencies are the test environment's, made
reachable by a ``.pth`` line naming its site-packages (a path line, so the test
environment's own ``.pth`` files, its editable install of this checkout among them,
are not run). From there, in a working directory of its own, the installed package
connects to the session's private server (loading its Lua library from the installed
files), runs jobs through a worker, serves a dashboard asset from its package data, and
its console script lists the simulator's shipped scenarios.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import tarfile
import textwrap
import zipfile
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "fairlane"
BUILD_TIMEOUT = 180
RUN_TIMEOUT = 60

pytestmark = pytest.mark.embedded_only


def _run(args: list[str], *, timeout: float = RUN_TIMEOUT, **options: Any) -> str:
    """Run a command to its end; its output, or a failure showing what it printed."""
    ran = subprocess.run(
        args, check=False, capture_output=True, text=True, timeout=timeout, **options
    )
    assert ran.returncode == 0, f"{args}: exit {ran.returncode}\n{ran.stdout}\n{ran.stderr}"
    return ran.stdout


def _package_files() -> set[str]:
    """Every file of the package in this checkout, as the wheel names it."""
    return {
        path.relative_to(PACKAGE.parent).as_posix()
        for path in PACKAGE.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    out = tmp_path_factory.mktemp("dist")
    _run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
        timeout=BUILD_TIMEOUT,
    )
    (wheel,) = out.glob("fairlane-*.whl")
    (sdist,) = out.glob("fairlane-*.tar.gz")
    return wheel, sdist


def test_the_wheel_holds_the_whole_package_and_nothing_else(dists: tuple[Path, Path]) -> None:
    wheel, _ = dists
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        info = next(name for name in names if name.endswith(".dist-info/METADATA"))
        metadata = archive.read(info).decode()
        entry_points = archive.read(info.replace("METADATA", "entry_points.txt")).decode()
    shipped = {name for name in names if not name.split("/")[0].endswith(".dist-info")}
    expected = _package_files()
    assert expected - shipped == set()
    assert shipped - expected == set()
    for needed in (
        "fairlane/py.typed",
        "fairlane/store/lua/fairlane.lua",
        "fairlane/gateway/ui/static/index.html",
        "fairlane/sim/scenarios/noisy-neighbor.toml",
    ):
        assert needed in shipped
    assert "Requires-Python: >=3.11" in metadata
    assert "Provides-Extra: embedded" in metadata
    assert "fairlane = fairlane.cli:main" in entry_points


def test_the_sdist_holds_what_a_build_and_the_readme_need(dists: tuple[Path, Path]) -> None:
    _, sdist = dists
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    for needed in (
        "pyproject.toml",
        "README.md",
        "src/fairlane/store/lua/fairlane.lua",
        "src/fairlane/gateway/ui/static/app.js",
        "scripts/demo",
        "scripts/test",
    ):
        assert needed in names
    assert not any(name.startswith((".venv/", "dist/")) for name in names)


RUN_FROM_THE_WHEEL = """
import asyncio, sys
from pathlib import Path

import httpx
import fairlane
from fairlane import App
from fairlane.gateway import create_app

assert Path(fairlane.__file__).is_relative_to(Path(sys.prefix)), fairlane.__file__

app = App(sys.argv[1], redis_url=sys.argv[2])

@app.task(gateway=True)
async def double(n: int) -> int:
    return 2 * n

async def main() -> None:
    async with app:
        jobs = [await double.enqueue(n, tenant="acme") for n in range(5)]
        await app.run_worker(burst=True, concurrency=4)
        print("results", [await job.result(timeout=10) for job in jobs])
        api = create_app(app, admin_key="admin-" + "k" * 32)
        transport = httpx.ASGITransport(app=api)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            page = await client.get("/ui/static/style.css")
            print("asset", page.status_code, len(page.content) > 0)

asyncio.run(main())
"""


def test_the_wheel_installs_and_runs_from_a_fresh_environment(
    dists: tuple[Path, Path], tmp_path: Path, redis_url: str, namespace: str
) -> None:
    wheel, _ = dists
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    _run(
        [
            sys.executable, "-m", "pip", "--python", str(python), "install",
            "--quiet", "--no-deps", "--no-index", "--disable-pip-version-check", str(wheel),
        ]
    )  # fmt: skip
    purelib = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
    reach = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (Path(purelib.strip()) / "_test_dependencies.pth").write_text("\n".join(sorted(reach)) + "\n")

    work = tmp_path / "work"
    work.mkdir()
    env = {key: value for key, value in os.environ.items() if not key.startswith("FAIRLANE_")}
    env.pop("PYTHONPATH", None)
    script = work / "run.py"
    script.write_text(textwrap.dedent(RUN_FROM_THE_WHEEL))
    out = _run([str(python), str(script), namespace, redis_url], cwd=work, env=env)
    assert "results [0, 2, 4, 6, 8]" in out
    assert "asset 200 True" in out

    listed = _run([str(venv / "bin" / "fairlane"), "simulate", "--list"], cwd=work, env=env)
    assert "noisy-neighbor" in listed
