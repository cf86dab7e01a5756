"""The dashboard's job page in a real browser (headless Chromium): its backfills with their
progress, its upcoming skipped slots with their reason, and in its timeline the excluded days
and skipped slots ahead, and the reason of a slot recorded SKIPPED."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from slotcron import JobContext
from slotcron.jobs.registry import Registry, cron
from slotcron.store import backfills, skips
from slotcron.store.database import Database
from slotcron.store.tables import executions
from sqlalchemy import insert

from tests.conftest import wait_for
from tests.http.browser import chromium
from tests.http.conftest import READ_TOKEN, TOKEN, base_url
from tests.http.test_dashboard import chromium_path, give_token, profile_dir  # noqa: F401

JOB = "dash.daily"


def daily(excluded: date, ran: list[str]) -> list[Any]:
    registry = Registry()

    @cron("0 9 * * *", name=JOB, exclude_dates=[excluded], registry=registry)
    async def job(ctx: JobContext) -> None:
        ran.append(ctx.trigger)

    return list(registry)


def nine(day: date) -> datetime:
    return datetime(day.year, day.month, day.day, 9, tzinfo=UTC)


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_the_job_page_shows_backfills_skips_and_excluded_days(
    chromium_path: str,  # noqa: F811
    db: Database,
    serve: Any,
    tmp_path: Path,
) -> None:
    now = datetime.now(UTC)
    first = nine(now.date()) if now < nine(now.date()) else nine(now.date() + timedelta(days=1))
    excluded, skipped = first + timedelta(days=1), first + timedelta(days=2)
    ran: list[str] = []
    service = await serve(daily(excluded.date(), ran), admin_token=TOKEN, read_token=READ_TOKEN)
    await skips.skip(db, job=JOB, at=skipped, reason="quarterly audit", now=now)
    past = first - timedelta(days=30)
    async with db.transaction() as conn:
        await conn.execute(
            insert(executions).values(
                job_name=JOB, scheduled_at=past, trigger="cron", status="SKIPPED", attempt=1,
                created_at=past, finished_at=past, error="skipped: the export was moved",
            )
        )  # fmt: skip
    made = await backfills.create(
        db, job=JOB, start=first - timedelta(days=5), end=first - timedelta(days=1), rate=0, now=now
    )

    async def completed() -> bool:
        return (await backfills.listing(db, job=JOB))[0].status == "COMPLETED"

    await wait_for(completed, timeout=20, what="the backfill completed")
    assert ran.count("backfill") == made.total == 4  # (a live 09:00 may run too)
    async with chromium(chromium_path, profile_dir(tmp_path)) as page:
        await page.goto(f"{base_url(service)}/#job={JOB}")
        await give_token(page, TOKEN)
        row = f'#job-backfills tr[data-backfill="{made.id}"][data-status="COMPLETED"]'
        await page.wait_for(
            f"document.querySelector({json.dumps(row)}) !== null", what="the backfill's row"
        )
        text = await page.evaluate(f"document.querySelector({json.dumps(row)}).textContent")
        assert "4/4 done, 0 failed, 0 left" in text, text
        width = await page.evaluate(
            f"document.querySelector({json.dumps(row + ' .bar-done')}).style.width"
        )
        assert width == "100%", width
        skip_item = f'#job-skips li[data-skip="{skipped.isoformat().replace("+00:00", "Z")}"]'
        said = await page.evaluate(f"document.querySelector({json.dumps(skip_item)}).textContent")
        assert "quarterly audit" in said, said
        notes = await page.evaluate(
            "[...document.querySelectorAll('#job-timeline .cell.will-skip')]"
            ".map(c => c.dataset.note)"
        )
        assert notes == [
            f"excluded date: {excluded.date().isoformat()}",
            "skipped: quarterly audit",
        ], notes
        titles = await page.evaluate(
            "[...document.querySelectorAll('#job-timeline .cell[data-status=SKIPPED]')]"
            ".map(c => c.title)"
        )
        assert any("why: skipped: the export was moved" in t for t in titles), titles
        listed = await page.evaluate(
            "[...document.querySelectorAll('#job-next li')].map(li => li.textContent)"
        )
        assert any("SKIPPED, skipped: quarterly audit" in item for item in listed), listed
