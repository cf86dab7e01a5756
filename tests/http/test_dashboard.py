"""The dashboard in a real browser (headless Chromium): jobs and their executions show, and a
person can trigger a run, giving the admin token once for the session."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from app.registry import Registry, every
from app.store.database import Database
from app.store.tables import executions, jobs
from tests.conftest import CI, wait_for
from tests.http.browser import chromium, find_chromium
from tests.http.conftest import TOKEN, base_url


def dashboard_jobs() -> Registry:
    registry = Registry()

    @every(seconds=1, name="browser.tick", registry=registry)
    async def tick() -> None:
        pass

    @every(seconds=2, name="browser.broken", registry=registry)
    async def broken() -> None:
        raise RuntimeError("upstream answered 503")

    return registry


@pytest.fixture
def chromium_path() -> str:
    path = find_chromium()
    if path is None:
        message = "chromium is not installed (Debian: apt-get install chromium)"
        if CI:
            pytest.fail(f"CI=true: {message}")
        pytest.skip(message)
    return path


def row(job: str) -> str:
    return f'#jobs tr[data-job="{job}"]'


async def execution(db: Database, execution_id: int) -> Any:
    async with db.read() as conn:
        return (await conn.execute(select(executions).where(executions.c.id == execution_id))).one()


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_the_dashboard_shows_jobs_and_executions_and_triggers_a_run_with_the_token(
    chromium_path: str, db: Database, serve: Any, tmp_path: Path
) -> None:
    service = await serve(list(dashboard_jobs()), admin_token=TOKEN)
    url = base_url(service)
    profile = tmp_path / "chromium"
    profile.mkdir()
    async with chromium(chromium_path, profile) as page:
        await page.goto(f"{url}/")
        # Reads need the token once one is configured: the page asks for it before any data.
        await page.wait_for(
            "!document.getElementById('token-form').hidden", what="the token to be asked"
        )
        await page.click("#token-input")
        await page.type(TOKEN)
        await page.click("#token-save")

        await page.wait_for(
            f"document.querySelector({json.dumps(row('browser.tick'))}) !== null",
            what="the job to be listed",
        )
        await page.wait_for(
            "document.querySelector('#executions tr[data-status=\"COMPLETED\"]') !== null",
            what="a completed execution to show",
        )
        schedule = await page.evaluate(
            f"document.querySelector({json.dumps(row('browser.tick'))}).cells[1].textContent"
        )
        assert schedule
        # A failed run shows its error; a click shows the whole of it.
        await page.click('#executions tr[data-status="FAILED"] td.error')
        detail = await page.wait_for(
            "document.querySelector('#executions tr.detail pre')?.textContent",
            what="the error detail",
        )
        assert "RuntimeError: upstream answered 503" in detail
        await page.wait_for(
            "document.querySelector('#instances td.leader') !== null", what="the leader"
        )

        # Trigger: the token is already kept for the session, so nothing more is asked.
        await page.click(f'{row("browser.tick")} button[data-action="trigger"]')
        notice = await page.wait_for(
            "(() => { const n = document.getElementById('notice'); return !n.hidden"
            " && /queued execution \\d+/.test(n.textContent) && n.textContent })()",
            what="the trigger to be acknowledged",
        )
        assert await page.evaluate("document.getElementById('token-form').hidden")
        execution_id = int(notice.rsplit(" ", 1)[1])
        await page.wait_for(
            f"""document.querySelector(
                '#executions tr[data-execution="{execution_id}"][data-trigger="manual"]'
                + '[data-status="COMPLETED"]') !== null""",
            timeout=15,
            what="the manual run to show as COMPLETED",
        )
        stored = await execution(db, execution_id)
        assert (stored.job_name, stored.trigger, stored.status) == (
            "browser.tick",
            "manual",
            "COMPLETED",
        )

        # The token is kept for the session: a reload asks nothing and shows the data.
        await page.reload()
        await page.wait_for(
            f"document.querySelector({json.dumps(row('browser.tick'))}) !== null",
            what="the jobs after a reload",
        )
        assert await page.evaluate("document.getElementById('token-form').hidden")

        # Pause from the page, then the row says so.
        await page.click(f'{row("browser.tick")} button[data-action="pause"]')
        await page.wait_for(
            f"document.querySelector({json.dumps(row('browser.tick') + ' td.paused')}) !== null",
            what="the job to show paused",
        )
        await wait_for(lambda: _paused(db, "browser.tick"), what="the job paused in the database")
        if os.environ.get("SLOTCRON_SCREENSHOT"):
            await page.screenshot(Path(os.environ["SLOTCRON_SCREENSHOT"]))


async def _paused(db: Database, name: str) -> bool:
    async with db.read() as conn:
        return bool(
            (await conn.execute(select(jobs.c.paused).where(jobs.c.name == name))).scalar_one()
        )
