"""Tasks of a script run as ``__main__`` are named as a worker that imports the script names
them, and the declaration is warned about with the ``name=`` that fixes it.

Each case runs a real script in a fresh interpreter (how it is started decides what
``__main__`` is): ``python app.py`` and ``python -m app`` name a task ``app.send``, the
same name ``import app`` (what ``fairlane worker app:app`` does) gives it; a session
with no file (``python -c``) keeps ``__main__.send``. Every warning is a
``TaskNameWarning`` naming the fix; a task with ``name=`` and a module imported
normally are never warned about.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fairlane.registry.naming import script_module

SCRIPT = textwrap.dedent(
    """
    import json
    import sys
    import warnings

    from fairlane import App, TaskNameWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        app = App("names")

        @app.task
        async def send(to: str) -> None: ...

        @app.task(name="app.explicit")
        async def explicit() -> None: ...

        @app.workflow()
        async def flow(ctx) -> None: ...

        @app.cron("*/5 * * * *")
        async def tick() -> None: ...

    if __name__ in ("__main__", "app"):
        shown = [
            {"message": str(w.message), "file": w.filename, "line": w.lineno}
            for w in caught
            if issubclass(w.category, TaskNameWarning)
        ]
        others = [str(w.message) for w in caught if not issubclass(w.category, TaskNameWarning)]
        print(json.dumps({"tasks": sorted(app.tasks), "warnings": shown, "others": others}))
    """
)


def run(tmp_path: Path, *argv: str) -> dict[str, list]:  # type: ignore[type-arg]
    (tmp_path / "app.py").write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, *argv],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    out: dict[str, list] = json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[type-arg]
    return out


NAMED = ["app.explicit", "app.flow", "app.send", "cron:app.tick"]


@pytest.mark.parametrize("argv", [["app.py"], ["-m", "app"]], ids=["script", "module"])
def test_a_script_names_its_tasks_as_a_worker_importing_it_does(
    tmp_path: Path, argv: list[str]
) -> None:
    ran = run(tmp_path, *argv)
    imported = run(tmp_path, "-c", "import app")  # the worker's view: `fairlane worker app:app`
    assert ran["tasks"] == imported["tasks"] == NAMED
    assert ran["others"] == []
    messages = [w["message"] for w in ran["warnings"]]
    for message in messages:
        print(message)
    # one warning per task given no name, each with the declaration that fixes it
    assert len(messages) == 3
    assert messages[0].startswith("send is declared in __main__ without name=: named 'app.send'")
    assert messages[0].endswith('@app.task(name="app.send")')
    assert messages[1].endswith('@app.workflow(name="app.flow")')
    assert messages[2].endswith("@app.cron('*/5 * * * *', name=\"cron:app.tick\")")
    # each points at the user's declaration, not at Fairlane's code
    assert {Path(w["file"]).name for w in ran["warnings"]} == {"app.py"}
    assert imported["warnings"] == []


def test_a_session_with_no_file_keeps_main_and_is_told_the_fix(tmp_path: Path) -> None:
    ran = run(tmp_path, "-c", SCRIPT)
    assert ran["tasks"] == [
        "__main__.flow",
        "__main__.send",
        "app.explicit",
        "cron:__main__.tick",
    ]
    first = ran["warnings"][0]["message"]
    assert "named '__main__.send', which no worker importing a module can find" in first
    assert first.endswith('@app.task(name="myapp.send")')


def test_script_module_reads_how_the_script_was_started() -> None:
    assert script_module(None) is None
    module = type(sys)("__main__")
    assert script_module(module) is None  # an interactive session: no file
    module.__file__ = "/srv/jobs/app.py"
    assert script_module(module) == "app"
    module.__file__ = "/srv/jobs/my-app.py"  # no import statement reaches it by that name
    assert script_module(module) is None
    module.__file__ = "/srv/jobs/class.py"
    assert script_module(module) is None
