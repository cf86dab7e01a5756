"""slotcron.store.history: executions read back, newest slot first, paged by key."""

from __future__ import annotations

from datetime import timedelta

from slotcron.store import history, markers
from slotcron.store.database import Database
from slotcron.store.tables import executions
from sqlalchemy import select

from tests.store.common import (
    EARLY,
    LEASE,
    NOW,
    ODD,
    SLOT,
    add_run,
    claim_ahead,
    is_utc,
    register,
)


async def test_list_executions_filters_and_pages_newest_slot_first(db: Database) -> None:
    ids: dict[tuple[str, int], int] = {}
    for n in range(4):
        slot = SLOT + timedelta(minutes=n)
        ids["a", n] = await add_run(db, "a", slot, status="COMPLETED" if n % 2 else "FAILED")
        ids["A", n] = await add_run(db, "A", slot, status="COMPLETED")
    everything = await history.list_executions(db, limit=100)
    assert [(r.job, r.scheduled_at) for r in everything] == [
        (job, SLOT + timedelta(minutes=n)) for n in (3, 2, 1, 0) for job in ("A", "a")
    ]
    failed = await history.list_executions(db, job="a", status="FAILED")
    assert [r.id for r in failed] == [ids["a", 2], ids["a", 0]]
    since = await history.list_executions(db, job="A", since=SLOT + timedelta(minutes=2))
    assert [r.id for r in since] == [ids["A", 3], ids["A", 2]]
    assert [r.id for r in await history.list_executions(db, limit=2, offset=6)] == [
        ids["A", 0],
        ids["a", 0],
    ]
    # Keyset pages: each starts right after the last row of the previous one.
    seen: list[int] = []
    before = None
    while page := await history.list_executions(db, limit=3, before=before):
        seen += [r.id for r in page]
        before = (page[-1].scheduled_at, page[-1].id)
    assert seen == [r.id for r in everything]
    assert await history.list_executions(db, job="nobody") == []


async def test_a_record_reads_every_column_back_and_a_chunks_start(db: Database) -> None:
    finished = await add_run(
        db,
        "job",
        ODD,
        status="FAILED",
        now=ODD,
        error="boom\nTraceback: é",
        params={"p": [1, "x"]},
        state={"s": {"t": None}},
        until=ODD + timedelta(hours=1),
        attempt=2,
        trigger="retry",
    )
    (record,) = await history.list_executions(db, job="job")
    assert (record.id, record.job, record.status, record.attempt, record.trigger) == (
        finished,
        "job",
        "FAILED",
        2,
        "retry",
    )
    assert (record.error, record.params, record.state) == (
        "boom\nTraceback: é",
        {"p": [1, "x"]},
        {"s": {"t": None}},
    )
    assert record.scheduled_at == ODD and record.until == ODD + timedelta(hours=1)
    for moment in (record.scheduled_at, record.started_at, record.finished_at, record.until):
        assert is_utc(moment) and moment is not None and moment.microsecond == 123457
    assert record.duration_ms == 0
    await register(db, "chunk")
    key, runs = await claim_ahead(db, "chunk")
    await markers.mark(
        db,
        key,
        ids=[runs["chunk"]],
        slot=SLOT,
        lease_until=EARLY + LEASE,
        instance_id="me",
        now=NOW,
    )
    (in_flight,) = await history.list_executions(db, job="chunk")
    assert (in_flight.status, in_flight.started_at, in_flight.duration_ms) == ("RUNNING", NOW, None)


async def test_execution_record_makes_a_record_of_a_row_mapping(db: Database) -> None:
    run = await add_run(db, params=None, state=None)
    async with db.read() as conn:
        row = (
            (await conn.execute(select(*history.RECORD_COLUMNS).where(executions.c.id == run)))
            .mappings()
            .one()
        )
    record = history.execution_record(row)
    assert (record.id, record.job, record.params, record.state, record.until) == (
        run,
        "job",
        {},
        {},
        None,
    )
    assert (record.started_at, record.lease_until) == (NOW, NOW + LEASE)
