"""The dashboard's list of runtime schedules (issue 15, item 6), on every backend: what
``GET /api/schedules`` adds for it (each schedule's last status and when its last run was due),
its pages, and the job endpoints the dashboard's buttons call (pause, resume, trigger by a
schedule's id) changing what the list shows; then the page itself in headless Chromium.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
from slotcron import JobContext
from slotcron.clock import ManualClock
from slotcron.jobs.registry import Registry, task
from slotcron.service.service import Service
from slotcron.store import schedules as store
from slotcron.store.database import Database
from slotcron.store.tables import executions, jobs
from sqlalchemy import event, insert, select
from yarl import URL

from tests.conftest import Services, wait_for
from tests.http.browser import chromium, find_chromium
from tests.http.conftest import READ_TOKEN, TOKEN, auth, base_url

TASK = "dash.report"
OTHER = "dash.other"
T0 = datetime(2026, 11, 22, 0, 0, 0, 500000, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return datetime(2026, 11, 22, tzinfo=UTC) + timedelta(seconds=seconds)


def tasks() -> Registry:
    registry = Registry()

    @task(name=TASK, registry=registry)
    async def report(ctx: JobContext) -> None:
        if ctx.params.get("fail"):
            raise RuntimeError(f"report for {ctx.params.get('tenant')} failed on purpose")

    @task(name=OTHER, registry=registry)
    async def other() -> None:
        pass

    return registry


Start = Callable[..., Awaitable[Service]]
SERVED = {"pool_size": 5, "http_port": 0, "admin_token": TOKEN, "read_token": READ_TOKEN}


@pytest.fixture
def start(services: Services) -> Start:
    """An instance running the tasks of :func:`tasks`, serving HTTP on a free port with the
    admin token (:class:`Services`)."""

    def start(clock: ManualClock | None = None, **overrides: Any) -> Awaitable[Service]:
        return services.start(clock=clock, tasks=tasks().tasks(), **{**SERVED, **overrides})

    return start


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as session:
        yield session


async def add(db: Database, now: datetime, **fields: Any) -> str:
    items = [{"task": TASK, **fields}]
    [record] = await store.create(
        db, items, default_timezone="UTC", by="test", registry=tasks(), now=now
    )
    return record.spec.id


async def listing(client: aiohttp.ClientSession, url: str, **query: Any) -> dict[str, Any]:
    async with client.get(
        URL(f"{url}/api/schedules").with_query(**query), headers=auth()
    ) as response:
        assert response.status == 200, await response.text()
        page: dict[str, Any] = await response.json()
        return page


async def listed(client: aiohttp.ClientSession, url: str) -> dict[str, dict[str, Any]]:
    page = await listing(client, url, limit=500)
    return {s["id"]: s for s in page["schedules"]}


async def post(
    client: aiohttp.ClientSession, url: str, schedule_id: str, verb: str, body: Any = None
) -> tuple[int, Any]:
    """What the dashboard's buttons do: the job endpoint, the id percent-encoded ("/" too)."""
    path = f"{url}/api/jobs/{quote(schedule_id, safe='')}/{verb}"
    async with client.post(path, json=body or {}, headers=auth()) as response:
        return response.status, await response.json()


def held(service: Service, schedule_id: str) -> bool:
    return service.schedule_planner.current.get(schedule_id) is not None


async def settled(db: Database, job: str, count: int) -> bool:
    """``job`` has ``count`` executions and none still QUEUED or RUNNING."""
    async with db.read() as conn:
        statuses = (
            await conn.execute(select(executions.c.status).where(executions.c.job_name == job))
        ).scalars()
        seen = list(statuses)
    return len(seen) == count and not {"QUEUED", "RUNNING"} & set(seen)


async def test_a_schedule_lists_no_last_status_until_it_runs_then_its_latest_run(
    db: Database, start: Start, client: aiohttp.ClientSession
) -> None:
    clock = ManualClock(T0)
    ok = await add(db, T0, id="tenant/ok", every=10, params={"tenant": "ok"})
    bad = await add(db, T0, id="tenant/bad", every=10, params={"tenant": "bad", "fail": True})
    never = await add(db, T0, id="tenant/yearly", cron="0 0 1 1 *")
    service = await start(clock)
    url = base_url(service)
    await wait_for(lambda: held(service, ok) and held(service, bad), what="the schedules loaded")

    before = await listed(client, url)
    for schedule_id in (ok, bad, never):
        assert before[schedule_id]["last_status"] is None, before[schedule_id]
        assert before[schedule_id]["last_run_at"] is None
    # The contract's fields are all still there, beside the new ones.
    assert before[ok]["every"] == 10 and before[ok]["paused"] is False
    assert before[ok]["next_slot"] == "2026-11-22T00:00:10Z"

    await clock.set(at(10))
    await wait_for(lambda: settled(db, ok, 1), what="the :10 slot of the ok schedule")
    await wait_for(lambda: settled(db, bad, 1), what="the :10 slot of the failing schedule")

    async def after_first() -> bool:
        now = await listed(client, url)
        return (now[ok]["last_status"], now[bad]["last_status"]) == ("COMPLETED", "FAILED")

    await wait_for(after_first, what="the first outcomes listed")
    first = await listed(client, url)
    assert first[ok]["last_run_at"] == first[bad]["last_run_at"] == "2026-11-22T00:00:10Z"
    assert first[never]["last_status"] is None

    # The latest run, not the first: a manual run of the failing one that succeeds.
    await clock.set(at(12))
    status, queued = await post(client, url, bad, "trigger", {"params": {"fail": False}})
    assert status == 202, queued
    await wait_for(lambda: settled(db, bad, 2), what="the manual run")

    async def after_trigger() -> bool:
        return bool((await listed(client, url))[bad]["last_status"] == "COMPLETED")

    await wait_for(after_trigger, what="the manual run's outcome listed")
    assert (await listed(client, url))[bad]["last_run_at"] == "2026-11-22T00:00:12Z"


async def insert_runs(db: Database, job: str, statuses: list[str]) -> None:
    """Executions of ``job``, oldest first, with ``statuses`` (a slot a minute apart)."""
    now = datetime.now(UTC)
    rows = [
        {
            "job_name": job,
            "scheduled_at": at(60 * (i + 1)),
            "trigger": "interval",
            "status": s,
            "attempt": 1,
            "created_at": now,
        }
        for i, s in enumerate(statuses)
    ]
    if rows:
        async with db.transaction() as conn:
            await conn.execute(insert(executions), rows)


async def test_pages_carry_each_schedules_own_last_status_and_the_task_filter_holds(
    db: Database, start: Start, client: aiohttp.ClientSession
) -> None:
    histories: dict[str, list[str]] = {
        "p/0": [],
        "p/1": ["COMPLETED"],
        "p/2": ["COMPLETED", "FAILED"],
        "p/3": ["FAILED", "SKIPPED", "MISSED"],
        # A run nobody has taken yet is not an outcome (as the jobs listing reads it).
        "p/4": ["ABANDONED", "QUEUED"],
        "p/5": ["RUNNING"],
        "p/6": ["COMPLETED", "STOPPED"],
    }
    for schedule_id, history in histories.items():
        await add(db, T0, id=schedule_id, cron="0 0 1 1 *")
        await insert_runs(db, schedule_id, history)
    other = [{"task": OTHER, "every": 60, "id": "q/0"}]
    await store.create(db, other, default_timezone="UTC", by="t", registry=tasks(), now=T0)
    await insert_runs(db, "q/0", ["FAILED"])
    outcomes: dict[str, list[str | None]] = {
        schedule_id: [None, *(s for s in history if s != "QUEUED")]
        for schedule_id, history in histories.items()
    }
    expected = {schedule_id: statuses[-1] for schedule_id, statuses in outcomes.items()}
    url = base_url(await start(ManualClock(T0)))

    seen: dict[str, Any] = {}
    offsets = []
    offset: int | None = 0
    while offset is not None:
        page = await listing(client, url, task=TASK, limit=3, offset=offset)
        assert len(page["schedules"]) <= 3 and page["offset"] == offset
        offsets.append(offset)
        for s in page["schedules"]:
            assert s["task"] == TASK
            seen[s["id"]] = s["last_status"]
        offset = page["next_offset"]
    assert offsets == [0, 3, 6]
    assert list(seen) == list(histories)  # ordered by id, each once
    assert seen == expected
    assert (await listed(client, url))["q/0"]["last_status"] == "FAILED"
    assert [s["id"] for s in (await listing(client, url, task=OTHER))["schedules"]] == ["q/0"]


async def test_the_last_statuses_of_a_page_are_one_statement_whatever_its_size(
    db: Database,
) -> None:
    ids = [f"n/{i:02}" for i in range(40)]
    for schedule_id in ids:
        await add(db, T0, id=schedule_id, every=60)
    for schedule_id in ids[::2]:
        await insert_runs(db, schedule_id, ["FAILED", "COMPLETED"])
    statements: list[str] = []

    def seen(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if "scheduler_executions" in statement:
            statements.append(statement)

    engine = db.engine.sync_engine
    event.listen(engine, "before_cursor_execute", seen)
    try:
        last = await store.last_runs(db, ids)
    finally:
        event.remove(engine, "before_cursor_execute", seen)
    assert len(statements) == 1, statements
    assert sorted(last) == ids[::2]
    assert {run.status for run in last.values()} == {"COMPLETED"}
    assert {run.scheduled_at for run in last.values()} == {at(120)}


async def test_pause_resume_and_trigger_by_id_change_what_the_list_shows(
    db: Database, start: Start, client: aiohttp.ClientSession
) -> None:
    clock = ManualClock(T0)
    schedule_id = await add(db, T0, every=10, params={"tenant": 7})  # a generated id, with "/"
    assert "/" in schedule_id
    service = await start(clock)
    url = base_url(service)
    await wait_for(lambda: held(service, schedule_id), what="the schedule loaded")

    status, answer = await post(
        client, url, schedule_id, "pause", {"reason": "paused from the dashboard"}
    )
    assert (status, answer["paused"], answer["changed"]) == (200, True, True), answer

    async def shows(paused: bool, last: str | None) -> bool:
        row = (await listed(client, url))[schedule_id]
        return bool(row["paused"] is paused and row["last_status"] == last)

    await wait_for(lambda: shows(True, None), what="the schedule listed paused")
    # A paused schedule's slot is recorded SKIPPED, and the list says so.
    await clock.set(at(10))
    await wait_for(lambda: settled(db, schedule_id, 1), what="the paused :10 slot")
    await wait_for(lambda: shows(True, "SKIPPED"), what="the SKIPPED slot listed")

    status, answer = await post(client, url, schedule_id, "resume")
    assert (status, answer["paused"], answer["changed"]) == (200, False, True), answer
    await wait_for(lambda: shows(False, "SKIPPED"), what="the schedule listed resumed")

    await clock.set(at(13))
    status, queued = await post(client, url, schedule_id, "trigger")
    assert status == 202 and queued["execution_id"], queued
    await wait_for(lambda: settled(db, schedule_id, 2), what="the manual run")
    await wait_for(lambda: shows(False, "COMPLETED"), what="the manual run listed")
    assert (await listed(client, url))[schedule_id]["last_run_at"] == "2026-11-22T00:00:13Z"

    # What the dashboard shows when the API refuses: an error naming the problem.
    status, answer = await post(client, url, "no/such-schedule", "pause")
    assert status == 404 and "no/such-schedule" in answer["error"], answer
    async with db.read() as conn:
        paused = await conn.scalar(select(jobs.c.paused).where(jobs.c.name == schedule_id))
    assert not paused


# The page itself, in headless Chromium

XSS_ID = 'evil/<img src=x onerror="window.__xss=1">'
XSS_PARAMS = {"note": "</td><script>window.__xss=2</script>", "tenant": "<b>9</b>"}


@pytest.fixture
def chromium_path() -> str:
    path = find_chromium()
    if path is None:
        pytest.skip("chromium is not installed (Debian: apt-get install chromium)")
    return path


def row(schedule_id: str) -> str:
    """A JS expression: the dashboard's row of ``schedule_id`` (found by value, so any id)."""
    return (
        "[...document.querySelectorAll('#schedules tbody tr')]"
        f".find(r => r.dataset.schedule === {json.dumps(schedule_id)})"
    )


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_the_dashboard_lists_schedules_escaped_and_pauses_resumes_and_triggers_one(
    chromium_path: str, db: Database, start: Start, tmp_path: Path
) -> None:
    now = datetime.now(UTC).replace(microsecond=0)
    clock = ManualClock(now)
    ok = await add(db, now, id="tenant/42", cron="0 9 * * *", timezone="Asia/Seoul")
    await add(db, now, id=XSS_ID, every=3600, params=XSS_PARAMS)
    await insert_runs(db, ok, ["FAILED", "COMPLETED"])
    service = await start(clock)
    profile = tmp_path / "chromium"
    profile.mkdir()
    async with chromium(chromium_path, profile) as page:
        await page.goto(f"{base_url(service)}/")
        await page.wait_for(
            "!document.getElementById('token-form').hidden", what="the token to be asked"
        )
        await page.click("#token-input")
        await page.type(TOKEN)
        await page.click("#token-save")

        texts = "[...r.cells].map(c => c.textContent)"
        cells = await page.wait_for(
            f"(() => {{ const r = {row(ok)}; return r && {texts} }})()",
            what="the schedule's row",
        )
        assert cells[0] == ok and cells[1] == TASK
        assert "0 9 * * *" in cells[2] and "Asia/Seoul" in cells[2]
        assert "COMPLETED" in cells[5], cells

        # User data shows as text, never as markup.
        xss = await page.wait_for(
            f"(() => {{ const r = {row(XSS_ID)}; return r && r.textContent; }})()",
            what="the row of the id holding markup",
        )
        assert XSS_ID in xss and "<script>window.__xss=2</script>" in xss
        assert "every 3600s" in xss
        assert await page.evaluate("window.__xss === undefined")
        markup = "#schedules img, #schedules b, #schedules script"
        assert await page.evaluate(f"document.querySelector({json.dumps(markup)}) === null")

        # Pause: the row says so, and so does the database.
        await press(page, ok, "pause")
        await page.wait_for(
            f"{row(ok)}?.dataset.paused === 'true'", what="the schedule to show paused"
        )
        await wait_for(lambda: _paused(db, ok), what="the schedule paused in the database")
        # Resume, from the button the row now holds.
        await press(page, ok, "resume")
        await page.wait_for(
            f"{row(ok)}?.dataset.paused === 'false'", what="the schedule to show resumed"
        )
        await wait_for(lambda: not_(_paused(db, ok)), what="the schedule resumed in the database")

        # Trigger: acknowledged, and its run becomes the row's last status.
        await press(page, XSS_ID, "trigger")
        await page.wait_for(
            "/queued execution \\d+/.test(document.getElementById('notice').textContent)",
            what="the trigger to be acknowledged",
        )
        await page.wait_for(
            f"{row(XSS_ID)}?.dataset.lastStatus === 'COMPLETED'",
            timeout=15,
            what="the manual run listed COMPLETED",
        )
        assert await page.evaluate("window.__xss === undefined")
        if os.environ.get("SLOTCRON_SCREENSHOT"):
            await page.screenshot(Path(os.environ["SLOTCRON_SCREENSHOT"]))

        # Its id opens its page: its history and timeline under its id, and its buttons.
        await page.evaluate(f"{row(ok)}.querySelector('a').dataset.test = 'open'")
        await page.click('#schedules a[data-test="open"]')
        await page.wait_for(
            f"""document.getElementById('job-title').textContent === {json.dumps(ok)}
            && /task dash.report/.test(document.getElementById('job-schedule').textContent)
            && document.querySelector('#job-history tr[data-status="FAILED"]') !== null
            && document.querySelector('#job-controls button[data-action="pause"]') !== null""",
            what="the schedule's page",
        )


async def press(page: Any, schedule_id: str, action: str) -> None:
    """Click the ``action`` button of ``schedule_id``'s row, as a person would."""
    await page.wait_for(
        f"{row(schedule_id)}?.querySelector('button[data-action={action}]') != null",
        what=f"the {action} button of {schedule_id}",
    )
    await page.evaluate(
        f"{row(schedule_id)}.querySelector('button[data-action={action}]').dataset.test = 'x'"
    )
    await page.click('#schedules button[data-test="x"]')


async def _paused(db: Database, name: str) -> bool:
    async with db.read() as conn:
        return bool(await conn.scalar(select(jobs.c.paused).where(jobs.c.name == name)))


async def not_(value: Any) -> bool:
    return not await value
