"""The dashboard in a real browser (headless Chromium): jobs and their executions show, and a
person can trigger a run, giving the admin token once for the session; the slot timeline shows
every outcome and opens an execution on its job's page; the page polls only a change marker
while nothing changes; a non-ASCII admin token works."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from slotcron import JobContext
from slotcron.clock import ManualClock
from slotcron.jobs.registry import Registry, cron, every
from slotcron.store import operations
from slotcron.store.database import Database
from slotcron.store.tables import executions, jobs
from sqlalchemy import select, update

from tests.conftest import CI, wait_for
from tests.http.browser import chromium, find_chromium
from tests.http.conftest import READ_TOKEN, TOKEN, base_url


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
    # Reads need a token once a read token is set: the page asks before it shows any data, and
    # the admin token given then reads and writes.
    service = await serve(list(dashboard_jobs()), admin_token=TOKEN, read_token=READ_TOKEN)
    url = base_url(service)
    profile = tmp_path / "chromium"
    profile.mkdir()
    async with chromium(chromium_path, profile) as page:
        await page.goto(f"{url}/")
        # Reads need a token once a read token is configured: asked for before any data.
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


# The slot timeline and the job page

NOTES = Path("/work/notes")
STEP = 10  # seconds between slots of every timeline job
STEPS = 36
JUMPS = {14: 4, 27: 3}  # at step k, the instance stalls this many periods: slots go MISSED
PAUSED_STEPS = range(6, 11)  # cache.warm is paused for these: its slots are SKIPPED
HUNG_STEP = STEPS - 1  # export.csv hangs here: RUNNING, and its next slot SKIPPED (overlap)


def timeline_jobs(release: asyncio.Event, base: datetime) -> Registry:
    registry = Registry()

    def step_of(ctx: JobContext) -> int:
        return round((ctx.scheduled_at - base).total_seconds()) // STEP

    @every(seconds=STEP, name="reports.daily", registry=registry)
    async def daily() -> None:
        pass

    @every(seconds=STEP, name="billing.sync", registry=registry)
    async def billing(ctx: JobContext) -> None:
        if step_of(ctx) % 4 == 0:
            raise RuntimeError(f"payment gateway answered 502 (step {step_of(ctx)})")

    @every(seconds=STEP, name="cache.warm", registry=registry)
    async def warm() -> None:
        pass

    @every(seconds=STEP, name="export.csv", registry=registry)
    async def export(ctx: JobContext) -> None:
        if step_of(ctx) == HUNG_STEP:
            await release.wait()

    return registry


async def _statuses(db: Database) -> dict[tuple[str, datetime], str]:
    async with db.read() as conn:
        rows = (await conn.execute(select(executions))).all()
    return {(r.job_name, r.scheduled_at): r.status for r in rows}


async def drive_timeline(db: Database, clock: ManualClock, base: datetime) -> None:
    """Move the manual clock slot by slot, pausing, failing, stalling and hanging on the way;
    each step waits until every job has decided its slot."""
    names = ("reports.daily", "billing.sync", "cache.warm", "export.csv")
    k = 0
    while k < STEPS:
        k += JUMPS.get(k, 1)
        if k == PAUSED_STEPS.start:
            await operations.set_paused(db, job="cache.warm", paused=True, reason="warming off")
        if k == PAUSED_STEPS.stop:
            await operations.set_paused(db, job="cache.warm", paused=False, reason=None)
        # A lag that varies from slot to slot, for the chart.
        await clock.set(base + timedelta(seconds=k * STEP, milliseconds=300 + 137 * (k % 7)))
        slot = base + timedelta(seconds=k * STEP)

        async def decided(slot: datetime = slot, k: int = k) -> bool:
            seen = await _statuses(db)
            hung = (("export.csv", base + timedelta(seconds=HUNG_STEP * STEP)),)
            running = [key for key, value in seen.items() if value == "RUNNING" and key not in hung]
            return not running and all((name, slot) in seen for name in names)

        await wait_for(decided, timeout=15, what=f"every job to decide step {k}")


def keep(shot: Path) -> None:
    """Copy a screenshot the run took to the team's notes, when there are notes to keep."""
    if NOTES.is_dir():
        shutil.copy(shot, NOTES / shot.name)


def profile_dir(tmp_path: Path) -> Path:
    profile = tmp_path / "chromium"
    profile.mkdir()
    return profile


def cell(job: str, state: str) -> str:
    return f'#timeline .tl-row[data-job="{job}"] .cell[data-status="{state}"]'


async def give_token(page: Any, value: str) -> None:
    await page.wait_for(
        "!document.getElementById('token-form').hidden", what="the token to be asked"
    )
    await page.click("#token-input")
    await page.type(value)
    await page.click("#token-save")


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_the_timeline_colours_each_slot_by_outcome_and_a_cell_opens_it_on_the_job_page(
    chromium_path: str, db: Database, serve: Any, tmp_path: Path
) -> None:
    release = asyncio.Event()
    now = datetime.now(UTC).replace(microsecond=0)
    # The manual clock ends near the browser's own time, so "in 5s" reads true.
    base = now - timedelta(seconds=now.second % STEP + STEPS * STEP)
    clock = ManualClock(base + timedelta(milliseconds=500))
    # A long lease: the manual clock does not move the heartbeat, so nothing lapses by itself.
    service = await serve(
        list(timeline_jobs(release, base)),
        clock=clock,
        admin_token=TOKEN,
        read_token=READ_TOKEN,
        lease_seconds=600,
    )
    try:
        await drive_timeline(db, clock, base)
        seen = await _statuses(db)
        outcomes = {status for status in seen.values()}
        assert {"COMPLETED", "FAILED", "MISSED", "SKIPPED", "RUNNING"} <= outcomes, outcomes
        async with chromium(chromium_path, profile_dir(tmp_path)) as page:
            await page.goto(f"{base_url(service)}/")
            await give_token(page, TOKEN)
            for job, state in [
                ("reports.daily", "COMPLETED"),
                ("billing.sync", "FAILED"),
                ("cache.warm", "SKIPPED"),
                ("reports.daily", "MISSED"),
                ("export.csv", "RUNNING"),
                ("export.csv", "PENDING"),
            ]:
                await page.wait_for(
                    f"document.querySelector({json.dumps(cell(job, state))}) !== null",
                    what=f"a {state} cell in the timeline of {job}",
                )
            # Each row holds one cell per slot the job has, then its next slots.
            counts = await page.evaluate(
                """Object.fromEntries([...document.querySelectorAll('#timeline .tl-row')]
                .map(r => [r.dataset.job, r.querySelectorAll('.cell').length]))"""
            )
            for job in ("reports.daily", "billing.sync", "cache.warm", "export.csv"):
                slots = sum(1 for name, _ in seen if name == job)
                assert counts[job] == slots + 2, (job, counts, slots)
            # Distinct colours, as the browser paints them.
            colours = await page.evaluate(
                """[...new Set([...document.querySelectorAll('#timeline .cell')]
                .map(c => getComputedStyle(c).backgroundColor))]"""
            )
            assert len(colours) >= 5, colours
            title = await page.evaluate(
                f"document.querySelector({json.dumps(cell('billing.sync', 'FAILED'))}).title"
            )
            assert "FAILED (attempt 1, interval)" in title
            assert all(word in title for word in ("slot ", "instance ", "lag ", "duration "))
            shot = tmp_path / "timeline.png"
            await page.screenshot(shot)
            assert shot.stat().st_size > 10_000
            await asyncio.to_thread(keep, shot)

            # A click on a failed cell opens that execution on the job's page.
            failed_id = await page.evaluate(
                f"document.querySelector({json.dumps(cell('billing.sync', 'FAILED'))})"
                ".dataset.execution"
            )
            await page.click(cell("billing.sync", "FAILED"))
            await page.wait_for(
                f"""(() => {{ const d = document.getElementById('execution-detail');
                    return !d.hidden && d.dataset.execution === {json.dumps(failed_id)}
                    && d.dataset.status === 'FAILED'; }})()""",
                what="the failed execution opened",
            )
            error = await page.evaluate("document.getElementById('execution-error').textContent")
            assert "RuntimeError: payment gateway answered 502" in error
            assert await page.evaluate("document.getElementById('overview').hidden")
            assert (
                await page.evaluate("document.getElementById('job-title').textContent")
                == "billing.sync"
            )
            # Its next slots, a chart of lag and duration, its history, its controls.
            next_slots = await page.evaluate(
                "[...document.querySelectorAll('#job-next li')].map(li => li.textContent)"
            )
            assert len(next_slots) == 5, next_slots
            points = await page.evaluate(
                """({lag: document.querySelectorAll('#job-chart circle[data-series=lag]').length,
                duration: document.querySelectorAll('#job-chart circle[data-series=duration]')
                .length})"""
            )
            started = sum(
                1
                for (name, _), s in seen.items()
                if name == "billing.sync" and s in ("COMPLETED", "FAILED")
            )
            assert points == {"lag": started, "duration": started}, points
            assert await page.evaluate(
                "document.querySelectorAll('#job-history tr[data-status=\"FAILED\"]').length"
            )
            await page.click('#job-controls button[data-action="pause"]')
            await wait_for(lambda: _paused(db, "billing.sync"), what="billing.sync paused")
            await page.wait_for(
                "document.getElementById('job-paused').textContent.startsWith('paused')",
                what="the job page to say paused",
            )
            # Restart from the opened execution queues a new attempt of that slot.
            await page.click('#execution-fields button[data-action="restart"]')
            await page.wait_for(
                "/queued execution \\d+/.test(document.getElementById('notice').textContent)",
                what="the restart to be queued",
            )
            # Closing the execution leaves the job's page.
            await page.click("#execution-close")
            await page.wait_for(
                "document.getElementById('execution-detail').hidden"
                " && !document.getElementById('job-page').hidden",
                what="the execution closed",
            )
            shot = tmp_path / "job-page.png"
            await page.screenshot(shot)
            await asyncio.to_thread(keep, shot)
    finally:
        release.set()


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_while_nothing_changes_the_page_polls_only_the_change_marker(
    chromium_path: str, db: Database, serve: Any, tmp_path: Path
) -> None:
    registry = Registry()

    @cron("0 0 1 1 *", name="quiet.yearly", registry=registry)
    async def yearly() -> None:
        pass

    service = await serve(list(registry))
    url = base_url(service)
    async with chromium(chromium_path, profile_dir(tmp_path)) as page:
        await page.goto(f"{url}/")
        await page.wait_for(
            f"document.querySelector({json.dumps(row('quiet.yearly'))}) !== null",
            what="the job to be listed",
        )
        await page.evaluate(
            """(() => { window.__calls = []; const original = window.fetch;
            window.fetch = (path, options) => { window.__calls.push(String(path));
            return original(path, options); }; })()"""
        )
        calls = "window.__calls.filter(p => p.startsWith({})).length"
        await page.wait_for(
            calls.format(json.dumps("api/changes")) + " >= 2",
            what="two polls of the change marker",
        )
        listed = await page.evaluate(
            "window.__calls.filter(p => /^api\\/(jobs|executions|timeline)/.test(p))"
        )
        assert listed == [], listed

        # A change made elsewhere (here, straight in the database) is fetched at the next poll.
        async with db.transaction() as conn:
            await conn.execute(
                update(jobs).where(jobs.c.name == "quiet.yearly").values(paused=True)
            )
        await page.wait_for(
            f"document.querySelector({json.dumps(row('quiet.yearly') + ' td.paused')}) !== null",
            what="the pause to show",
        )
        assert await page.evaluate(calls.format(json.dumps("api/executions")))
        assert await page.evaluate(calls.format(json.dumps("api/timeline")))


NON_ASCII_TOKEN = "tökén-✓-管理"


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_a_token_the_server_could_never_hold_is_refused_by_the_page_before_it_is_kept(
    chromium_path: str, db: Database, serve: Any, tmp_path: Path
) -> None:
    service = await serve(list(dashboard_jobs()), admin_token=TOKEN, read_token=READ_TOKEN)
    async with chromium(chromium_path, profile_dir(tmp_path)) as page:
        await page.goto(f"{base_url(service)}/")
        # A control character cannot travel in a header: refused before it is kept.
        await give_token(page, "tab\there")
        why = await page.wait_for(
            "/control character/.test(document.getElementById('token-why').textContent)"
            " && document.getElementById('token-why').textContent",
            what="the control character to be refused",
        )
        assert "no HTTP header can carry" in why
        assert await page.evaluate("sessionStorage.getItem('slotcron.token') === null")
        # SCHEDULER_ADMIN_TOKEN is printable ASCII (a configuration error otherwise).
        await give_token(page, NON_ASCII_TOKEN)
        why = await page.wait_for(
            "/printable ASCII/.test(document.getElementById('token-why').textContent)"
            " && document.getElementById('token-why').textContent",
            what="the non-ASCII token to be refused",
        )
        assert await page.evaluate("sessionStorage.getItem('slotcron.token') === null")
        await give_token(page, TOKEN)
        await page.wait_for(
            f"document.querySelector({json.dumps(row('browser.tick'))}) !== null",
            what="the jobs, read with the token",
        )
        await page.click(f'{row("browser.tick")} button[data-action="trigger"]')
        await page.wait_for(
            "/queued execution \\d+/.test(document.getElementById('notice').textContent)",
            what="the trigger, written with the token",
        )
        assert await page.evaluate("document.getElementById('token-form').hidden")
