"""The dashboard in headless Chromium: a real gateway under uvicorn, a real worker, a
real workload; pages render live data, the job page explains (and says why a waiting
job's start cannot be estimated), re-drive and cancel work through the page
(confirmation dialogs accepted), a tenant, a task and a lane are paused from their views
and resumed from the banner, and refusals hold.

Skipped only when the ``playwright`` package or ``/usr/bin/chromium`` is missing.
Screenshots go to ``/tmp/ui-shots/`` (never into the repository).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from fairlane import App
from fairlane.app.job import Job
from fairlane.gateway import ApiKeys
from tests.e2e.helpers import eventually, running_worker
from tests.ui.helpers import ADMIN_KEY, served, ui_app

CHROMIUM = Path("/usr/bin/chromium")
# CI installs both and sets FAIRLANE_REQUIRE_SYSTEM_PACKAGES=1: there a missing browser fails
REQUIRED = os.environ.get("FAIRLANE_REQUIRE_SYSTEM_PACKAGES") == "1"
if REQUIRED:
    from playwright import async_api

    assert CHROMIUM.exists(), "FAIRLANE_REQUIRE_SYSTEM_PACKAGES=1 but /usr/bin/chromium is missing"
else:
    async_api = pytest.importorskip("playwright.async_api", reason="playwright is missing")
pytestmark = [
    pytest.mark.anyio,
    pytest.mark.embedded_only,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="no Chromium at /usr/bin/chromium"),
]
SHOTS = Path(os.environ.get("FAIRLANE_UI_SHOTS", "/tmp/ui-shots"))
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@asynccontextmanager
async def browser_page() -> AsyncIterator[Any]:
    async with async_api.async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            page = await browser.new_page(viewport={"width": 1280, "height": 900})
            page.set_default_timeout(10_000)
            # every confirmation the page asks for is accepted, as an operator would
            page.on("dialog", lambda dialog: asyncio.ensure_future(dialog.accept()))
            yield page
        finally:
            await browser.close()


async def log_in(page: Any, base: str) -> None:
    await page.goto(f"{base}/ui/")
    assert page.url.endswith("/ui/login")
    await page.fill("input[name=key]", ADMIN_KEY)
    await page.click("button[type=submit]")
    await page.wait_for_url(f"{base}/ui/")


@pytest.fixture
def shots() -> Path:
    SHOTS.mkdir(parents=True, exist_ok=True)
    return SHOTS


@dataclass
class Workload:
    done: list[Job[Any]]
    dead: Job[Any]
    holders: list[Job[Any]]
    parked: list[Job[Any]]
    run: Job[Any]


async def workload(app: App) -> Workload:
    """Completed jobs of two tenants, a dead letter, a job waiting on a throttle key
    behind a running one, and jobs queued on a lane no worker serves."""
    echo, boom, later, hold = (app.get_task(n) for n in ("echo", "boom", "later", "hold"))
    run = await app.get_task("approval").enqueue("doc-1", tenant="beta")
    done = [await echo.enqueue("x", tenant=t) for t in ("acme", "beta", "acme")]
    dead = await boom.enqueue("no such document", tenant="zeta")
    holders = [await hold.enqueue(2.0, tenant="acme") for _ in range(2)]
    parked = [await later.enqueue(i, tenant="acme" if i else "beta") for i in range(3)]
    for job in done:
        await job.result(timeout=10)

    async def settled() -> bool:
        states = sorted([await h.status() for h in holders])
        (wait,) = await app.store.job_fields(run.id, "wf")
        return (
            await dead.status() == "failed"
            and states == ["running", "throttled"]
            and wait == b"signal:approve"
        )

    await eventually(settled)
    states = {h.id: await h.status() for h in holders}
    holders.sort(key=lambda h: states[h.id] != "running")  # the one that waits is last
    return Workload(done, dead, holders, parked, run)


async def show_job(page: Any, base: str, job_id: str) -> None:
    """Open a job's page and wait until it shows that job (not the page before)."""
    await page.goto(f"{base}/ui/#/job/{job_id}")
    await page.locator(f'main[data-job="{job_id}"]').wait_for()


async def check_live_and_job(page: Any, base: str, work: Workload, shots: Path) -> None:
    lane = page.locator("section.lane[data-lane=parked]")
    await lane.wait_for()
    assert "acme" in await lane.inner_text()
    throttles = page.locator("section", has_text="Throttle keys")
    assert "model:big" in await throttles.inner_text()
    await page.screenshot(path=str(shots / "live.png"), full_page=True)
    # the refresh interval the operator picks re-reads the live view on its own
    before = await page.get_attribute("body", "data-updated")
    await page.select_option("#refresh", "2")
    await page.wait_for_function(
        "before => document.body.dataset.updated !== before", arg=before, timeout=5000
    )
    await page.select_option("#refresh", "0")

    await show_job(page, base, work.done[0].id)
    assert "completed" in await page.locator("#explanation").inner_text()
    assert await page.locator("svg rect.seg-running").count() == 1
    assert await page.locator("#start-estimate").count() == 0  # its start is behind it

    # the job that waited for the throttle key: its events and the key in the answer
    await show_job(page, base, work.holders[1].id)
    explanation = page.locator("#explanation")
    assert "parked on throttle key model:big" in await explanation.inner_text()
    assert "parked" in await page.locator("section#events").inner_text()
    assert await page.locator("svg rect.seg-parked").count() == 1
    await page.screenshot(path=str(shots / "job.png"), full_page=True)

    await page.goto(f"{base}/ui/#/runs")
    await page.get_by_role("link", name=work.run.id).click()
    # the run's own page, not the list it was opened from (which also says "Workflow run")
    await page.locator("section", has_text="suspended (signal:approve)").wait_for()


async def redrive_and_cancel(page: Any, base: str, app: App, work: Workload, shots: Path) -> None:
    await page.goto(f"{base}/ui/#/dead")
    await page.get_by_role("link", name=work.dead.id).wait_for()
    # the list the re-drive re-draws is held until the operator has moved on to another
    # page: its late answer must not replace the page shown by then
    held: list[Any] = []

    async def hold(route: Any) -> None:
        held.append(route)

    await page.route("**/ui/api/dead", hold)
    await page.click("button[data-action=redrive]")

    async def redriven() -> bool:
        # it fails again at once (one attempt): its log shows the re-drive
        return "redriven" in [e.kind for e in await app.store.job_events(work.dead.id)]

    async def redraw_asked() -> bool:
        return bool(held)

    await eventually(redriven)
    await eventually(redraw_asked)

    parked = work.parked
    await page.goto(f"{base}/ui/#/jobs?state=queued&tenant=acme")
    await page.get_by_role("link", name=parked[1].id).wait_for()
    async with page.expect_response("**/ui/api/dead"):
        for route in held:
            await route.continue_()
    await page.unroute("**/ui/api/dead")
    # the answer is parsed and dropped in the page's next turns; then the jobs are still shown
    await page.evaluate("() => new Promise((done) => setTimeout(done, 200))")
    assert await page.get_attribute("main", "data-view") == "jobs"
    await page.get_by_role("link", name=parked[1].id).wait_for(timeout=1000)
    assert await page.get_by_role("link", name=parked[0].id).count() == 0
    await page.screenshot(path=str(shots / "jobs.png"), full_page=True)
    await show_job(page, base, parked[1].id)
    await page.click("button[data-action=cancel]")

    async def cancelled() -> bool:
        return await parked[1].status() == "cancelled"

    await eventually(cancelled)
    assert await parked[2].status() == "queued"


async def pause_and_resume(page: Any, base: str, app: App, work: Workload, shots: Path) -> None:
    """Pause a tenant from its row in the live view (a reason and 30 minutes asked in the
    page's dialog), a task from its jobs, a lane from its card; the banner lists them, a
    waiting job's page says why it waits; each is resumed from the banner."""
    dialog, banner = page.locator("dialog#ask"), page.locator("#paused")
    await page.goto(f"{base}/ui/#/")
    lane = page.locator("section.lane[data-lane=parked]")
    await lane.locator('button[data-op=pause][data-scope="tenant:acme"]').first.click()
    await dialog.locator("input[name=reason]").fill("runaway loop")
    await dialog.locator("input[name=minutes]").fill("30")
    await dialog.locator("#ask-ok").click()
    await banner.locator('li[data-scope="tenant:acme"]').wait_for()
    assert "runaway loop" in await banner.inner_text()
    [entry] = await app.pauses.list()
    assert (entry.scope.tenant, entry.reason) == ("acme", "runaway loop")
    assert entry.by.startswith("admin:") and entry.until_ms > entry.at_ms
    await show_job(page, base, work.parked[2].id)
    assert "paused by an operator at " in await page.locator("#explanation").inner_text()
    await page.screenshot(path=str(shots / "paused.png"), full_page=True)

    await page.goto(f"{base}/ui/#/jobs?task=later")
    task = page.locator('#operate button[data-op=pause][data-scope="task:later"]')
    await task.click()
    await dialog.locator("button[value=cancel]").click()  # asked, and declined: nothing
    await task.click()
    await dialog.locator("input[name=reason]").fill("bad deploy")
    await dialog.locator("#ask-ok").click()
    await banner.locator('li[data-scope="task:later"]').wait_for()
    await page.goto(f"{base}/ui/#/")
    await lane.locator("h2 button[data-op=pause]").click()
    await dialog.locator("#ask-ok").click()
    await banner.locator('li[data-scope="lane:parked"]').wait_for()
    assert len(await app.pauses.list()) == 3
    for left in (2, 1, 0):
        await banner.locator("button[data-op=resume]").first.click()
        await page.wait_for_function(
            "n => document.querySelectorAll('#paused li').length === n", arg=left
        )
    assert await banner.is_hidden()
    assert await app.pauses.list() == []
    trail = await app.store.key_records.audit.read(20, action="pause")
    assert [e.outcome for e in trail] == ["paused"] * 3  # the declined one is no entry


async def check_audit(page: Any, base: str, app: App) -> None:
    """The audit page lists a key's creation, and a tenant name that looks like markup
    is shown as text."""
    tenant = "<img src=x onerror=alert(1)>"
    minted = await ApiKeys(app.store.key_records).create(tenant)
    await page.goto(f"{base}/ui/#/audit")
    await page.get_by_role("cell", name=minted.key_id).wait_for()
    await page.get_by_role("cell", name=tenant).wait_for()
    assert await page.locator("main img").count() == 0


async def test_dashboard_end_to_end(redis_url: str, namespace: str, shots: Path) -> None:
    app = ui_app(namespace, redis_url)
    async with app:
        with served(namespace, redis_url, admin_scopes=("read", "operate")) as gw:
            async with running_worker(app, concurrency=4), browser_page() as page:
                work = await workload(app)
                await log_in(page, gw.base)
                await check_live_and_job(page, gw.base, work, shots)
                await redrive_and_cancel(page, gw.base, app, work, shots)
                await pause_and_resume(page, gw.base, app, work, shots)
                # the page's own session cannot write without its CSRF token
                status = await page.evaluate(
                    """async (id) => (await fetch(`api/jobs/${id}/cancel`,
                        {method: "POST", credentials: "same-origin"})).status""",
                    work.parked[2].id,
                )
                assert status == 403
                assert await work.parked[2].status() == "queued"
        waiting = work.parked[2].id
        with served(namespace, redis_url, ui_read_only=True) as gw:
            async with httpx.AsyncClient(base_url=gw.base) as http:
                assert (await http.get("/ui/api/overview")).status_code == 401
                login = await http.post("/ui/login", data={"key": ADMIN_KEY})
                assert login.status_code == 303
                r = await http.post(f"/ui/api/jobs/{waiting}/cancel")
                assert r.status_code == 403 and "read-only" in r.json()["detail"]
            async with browser_page() as page:
                await log_in(page, gw.base)
                await page.locator("#mode").wait_for()
                await page.locator("section.lane[data-lane=parked]").wait_for()
                assert await page.locator("button[data-op]").count() == 0  # no pauses here
                await check_audit(page, gw.base, app)
                await show_job(page, gw.base, waiting)
                assert await page.locator("button[data-action]").count() == 0
                # a waiting job's start estimate, or why none can be made
                estimate = await page.locator("#start-estimate").inner_text()
                assert estimate == "no start estimate: no live worker serves its lane"
