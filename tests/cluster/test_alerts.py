"""Two real instances racing failing jobs: the webhook gets each failure exactly once, from the
instance that recorded it, and nothing of a job declared ``alert=False``."""

from __future__ import annotations

import asyncio
import signal
from collections import Counter
from datetime import datetime

import pytest
from slotcron.store.database import Database
from slotcron.store.tables import executions
from sqlalchemy import select

from tests.cluster.conftest import Spawn
from tests.cluster.harness import percentile
from tests.conftest import wait_for
from tests.webhook import webhook

JOBS = "tests.cluster.jobs_alerts"


@pytest.mark.parametrize("backend", ["postgresql", "mariadb"], indirect=True)
async def test_two_processes_send_each_failure_once_and_quiet_jobs_none(
    db: Database, spawn: Spawn
) -> None:
    async with webhook() as hook:
        env = {"SCHEDULER_ALERT_WEBHOOK_URL": hook.url, "SCHEDULER_ALERT_EVENTS": "FAILED"}
        a = spawn("alerts-a", JOBS, **env)
        b = spawn("alerts-b", JOBS, **env)

        def from_both() -> bool:
            senders = Counter(r.body["sent_by"] for r in hook.accepted)
            return len(hook.accepted) >= 100 and len(senders) == 2

        await wait_for(from_both, timeout=60, interval=0.2, what="100 events from both instances")
        for proc in (a, b):
            proc.signal(signal.SIGTERM)
        for proc in (a, b):
            assert await asyncio.to_thread(proc.wait, 30) == 0, proc.log()

    async with db.read() as conn:
        failed = (
            await conn.execute(
                select(executions.c.id, executions.c.job_name, executions.c.instance_id).where(
                    executions.c.status == "FAILED"
                )
            )
        ).all()
    loud = {row.id: row.instance_id for row in failed if row.job_name != "quiet"}
    assert any(row.job_name == "quiet" for row in failed), "the quiet job ran and failed"
    sent = Counter(r.body["execution_id"] for r in hook.accepted)
    duplicates = sum(n - 1 for n in sent.values())
    assert duplicates == 0
    assert set(sent) == set(loud), "every failure of an alerting job is sent, once"
    assert all(r.body["job"] != "quiet" for r in hook.posts)
    for received in hook.accepted:  # by the instance that recorded the failure
        assert received.body["sent_by"] == loud[received.body["execution_id"]]
    delays = [r.at - datetime.fromisoformat(r.body["at"]).timestamp() for r in hook.accepted]
    print(
        f"\nwebhook delivery, 2 processes: {len(hook.accepted)} events, duplicates {duplicates}, "
        f"delay p50 {percentile(delays, 0.5) * 1000:.1f} ms, "
        f"p99 {percentile(delays, 0.99) * 1000:.1f} ms, max {max(delays) * 1000:.1f} ms"
    )
    assert percentile(delays, 0.99) < 5.0
