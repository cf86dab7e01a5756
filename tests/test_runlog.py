"""The run log's quotas: past a number of lines a second, one line says how many were left out.
Under overload an instance recorded thousands of slots SKIPPED a second, a line each."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import pytest
from slotcron.observe.hooks import SlotsEvent
from slotcron.observe.runlog import SKIPPED_LINES_PER_SECOND, LineQuota, RunLog, claims_log
from slotcron.store.claims import Claim

SLOT = datetime(2026, 11, 22, 0, 10, tzinfo=UTC)


def recorded(i: int, status: str) -> tuple[SlotsEvent, Claim]:
    slot = SLOT + timedelta(seconds=i)
    reason = "overlap: execution 1 is still running on a (overlap='forbid')"
    event = SlotsEvent(job=f"job-{i}", status=status, reason=reason, first=slot, last=slot)
    claim = Claim(
        execution_id=100 + i,
        job_name=event.job,
        scheduled_at=slot,
        trigger="cron",
        status=status,
        attempt=1,
        lease_until=None,
        lease_ms=None,
        reason=reason,
    )
    return event, claim


def test_skipped_slots_past_the_quota_are_counted_in_one_line_the_next_second(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [1000.2]
    log = RunLog("a")
    log._skipped_lines = LineQuota(
        SKIPPED_LINES_PER_SECOND, claims_log, "%d more slots SKIPPED", clock=lambda: now[0]
    )
    caplog.set_level(logging.DEBUG, logger="slotcron.claims")
    for i in range(SKIPPED_LINES_PER_SECOND + 30):
        log.slots_passed(*recorded(i, "SKIPPED"), None)
    for i in range(5):  # single MISSED slots are DEBUG, and outside the quota
        log.slots_passed(*recorded(100 + i, "MISSED"), None)
    lines = [r for r in caplog.records if r.name == "slotcron.claims"]
    assert [r.levelno for r in lines] == [logging.INFO] * SKIPPED_LINES_PER_SECOND + [
        logging.DEBUG
    ] * 5
    assert lines[0].getMessage().startswith("job-0 slot 2026-11-22T00:10:00+00:00 SKIPPED: ")
    caplog.clear()
    now[0] = 1001.05
    log.slots_passed(*recorded(200, "SKIPPED"), None)
    assert [r.getMessage() for r in caplog.records] == [
        "30 more slots SKIPPED in that second without a line each (`slotcron history` lists them)",
        "job-200 slot 2026-11-22T00:13:20+00:00 SKIPPED: overlap: execution 1 is still running "
        "on a (overlap='forbid')",
    ]
