"""A client generated from the gateway's OpenAPI spec works against a live gateway.

The spec is read from a running gateway (uvicorn, ``tests/ui/helpers.served``) at
``/openapi.json``; ``openapi-python-client`` (a standard generator, in the dev extra)
turns it into a Python package in a temporary directory, with no post-generation hooks,
and the test imports that package and uses nothing else to talk to the gateway: it
submits a job and follows it to its result while a worker runs, and cancels a job no
worker serves. The generator must read the whole spec without a warning (it skips an
operation it cannot read). The operations are found in the generated code by the method
and path each one calls, so the test depends on the spec, not on the generator's naming.
"""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest

from fairlane.gateway import ApiKeys
from tests.e2e.helpers import running_worker
from tests.ui.helpers import served, ui_app

pytestmark = [pytest.mark.anyio, pytest.mark.embedded_only]

PACKAGE = "fairlane_gateway_client"
GENERATOR = Path(sys.executable).with_name("openapi-python-client")
TIMEOUT = 60


def _generate(spec: dict[str, Any], into: Path) -> Path:
    spec_file = into / "openapi.json"
    spec_file.write_text(json.dumps(spec))
    config = into / "generator.json"
    # no hooks: the generated code is used as the generator writes it
    config.write_text(json.dumps({"package_name_override": PACKAGE, "post_hooks": []}))
    out = into / PACKAGE
    ran = subprocess.run(
        [
            str(GENERATOR), "generate", "--path", str(spec_file), "--config", str(config),
            "--meta", "none", "--output-path", str(out),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )  # fmt: skip
    said = ran.stdout + ran.stderr
    # the generator skips what it cannot read with a warning: the spec must have none
    assert ran.returncode == 0 and "warning" not in said.lower(), said
    return out


def _operation(package: Path, method: str, path: str) -> ModuleType:
    """The generated module of the operation that sends ``method`` to ``path``."""
    calls = re.compile(
        rf"\"method\":\s*\"{method}\".*?\"url\":\s*f?\"{re.escape(path)}\"", re.DOTALL
    )
    found = [
        module
        for module in sorted((package / "api").rglob("*.py"))
        if calls.search(module.read_text())
    ]
    assert len(found) == 1, (method, path, found)
    dotted = ".".join(found[0].relative_to(package.parent).with_suffix("").parts)
    return importlib.import_module(dotted)


@pytest.fixture
def importable(tmp_path: Path) -> Any:
    sys.path.insert(0, str(tmp_path))
    try:
        yield tmp_path
    finally:
        sys.path.remove(str(tmp_path))
        for name in [name for name in sys.modules if name.split(".")[0] == PACKAGE]:
            del sys.modules[name]


async def test_a_generated_client_submits_follows_and_cancels(
    redis_url: str, namespace: str, importable: Path
) -> None:
    app = ui_app(namespace, redis_url)
    async with app:
        key = (await ApiKeys(app.store.key_records).create("acme")).key
        with served(namespace, redis_url) as gw:
            async with httpx.AsyncClient(base_url=gw.base) as http:
                spec = (await http.get("/openapi.json")).raise_for_status().json()
            package = _generate(spec, importable)
            client_module = importlib.import_module(PACKAGE)
            models = importlib.import_module(f"{PACKAGE}.models")
            submit = _operation(package, "post", "/v1/jobs")
            read = _operation(package, "get", "/v1/jobs/{job_id}")
            result = _operation(package, "get", "/v1/jobs/{job_id}/result")
            cancel = _operation(package, "delete", "/v1/jobs/{job_id}")

            client = client_module.AuthenticatedClient(base_url=gw.base, token=key)
            async with client, running_worker(app, concurrency=2):
                added = await submit.asyncio(
                    client=client,
                    body=models.SubmitRequest(task=models.SubmitRequestTask("add"), args=[2, 3]),
                )
                assert isinstance(added, models.SubmitReply), added
                assert added.state == "accepted"
                done = await result.asyncio_detailed(added.id, client=client, wait=10.0)
                assert done.status_code == 200, done.content
                assert done.parsed.status == "completed"
                assert done.parsed.result == 5
                view = await read.asyncio(added.id, client=client)
                assert isinstance(view, models.JobView), view
                assert (view.status, view.task, view.tenant) == ("completed", "add", "acme")

                # lane "parked" has no worker: the job waits until it is cancelled
                parked = await submit.asyncio(
                    client=client,
                    body=models.SubmitRequest(task=models.SubmitRequestTask("later"), args=[1]),
                )
                assert isinstance(parked, models.SubmitReply), parked
                cancelled = await cancel.asyncio(parked.id, client=client)
                assert isinstance(cancelled, models.CancelReply), cancelled
                assert cancelled.status == "cancelled"
                view = await read.asyncio(parked.id, client=client)
                assert view.status == "cancelled"
                # without a key the gateway refuses, and the generated client says so
                async with client_module.Client(base_url=gw.base) as anonymous:
                    refused = await read.asyncio_detailed(parked.id, client=anonymous)
                assert refused.status_code == 401, refused.content
