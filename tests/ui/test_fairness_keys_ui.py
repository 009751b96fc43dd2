"""The dashboard's job detail names a job's fairness key (None for a job without one)."""

from __future__ import annotations

import httpx
import pytest

from fairlane.gateway import create_app
from tests.ui.helpers import ADMIN, ADMIN_KEY, ui_app

pytestmark = pytest.mark.anyio


async def test_the_job_detail_shows_the_fairness_key(redis_url: str, namespace: str) -> None:
    app = ui_app(namespace, redis_url)
    async with app:
        later = app.get_task("later")
        keyed = await later.enqueue(1, tenant="acme", fairness_key="user-42")
        plain = await later.enqueue(2, tenant="acme")
        api = create_app(app, admin_key=ADMIN_KEY)
        transport = httpx.ASGITransport(app=api)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as http:
            shown = (await http.get(f"/ui/api/jobs/{keyed.id}", headers=ADMIN)).json()
            assert shown["fairness_key"] == "user-42" and shown["tenant"] == "acme"
            shown = (await http.get(f"/ui/api/jobs/{plain.id}", headers=ADMIN)).json()
            assert shown["fairness_key"] is None
