"""slotcron.store.passed_over: one MISSED row stands for a passed-over range, recorded once
under the job's row lock, like a claim."""

from __future__ import annotations

from datetime import timedelta

from slotcron.store import passed_over
from slotcron.store.database import Database
from slotcron.store.passed_over import Outcome, Range
from slotcron.store.tables import executions

from tests.store.common import NOW, SLOT, add_run, job_row, register, set_job, table_rows

FIRST = SLOT - timedelta(hours=3)
LAST = SLOT - timedelta(hours=1, minutes=1)
FOLLOWING = LAST + timedelta(minutes=1)


def passed(job: str, fingerprint: str | None = None) -> Range:
    return Range(job, FIRST, LAST, FOLLOWING, "cron", "passed over: outage", fingerprint)


async def test_record_writes_one_missed_row_per_range_and_advances_the_marks(
    db: Database,
) -> None:
    await register(db, "a", "A", "decided", "moved")
    await set_job(db, "decided", last_slot_at=FIRST + timedelta(minutes=5))
    await set_job(db, "moved", fingerprint="in-force")
    outcomes = await passed_over.record(
        db,
        [passed("a"), passed("A"), passed("decided"), passed("moved", "older"), passed("gone")],
        instance_id="me",
        now=NOW,
    )
    assert outcomes["decided"] == Outcome(high_water=FIRST + timedelta(minutes=5))
    assert outcomes["moved"] == Outcome(superseded=True)
    assert "gone" not in outcomes
    rows = {r["job_name"]: r for r in await table_rows(db, executions)}
    assert sorted(rows) == ["A", "a"]
    for name in ("a", "A"):
        assert outcomes[name] == Outcome(execution_id=rows[name]["id"])
        row = rows[name]
        assert (row["status"], row["scheduled_at"], row["until"], row["error"]) == (
            "MISSED",
            FIRST,
            LAST,
            "passed over: outage",
        )
        assert (row["instance_id"], row["finished_at"], row["trigger"]) == ("me", NOW, "cron")
        job = await job_row(db, name)
        assert (job["last_slot_at"], job["next_slot_at"]) == (LAST, FOLLOWING)
    again = await passed_over.record(db, [passed("a")], instance_id="other", now=NOW)
    assert again == {"a": Outcome(high_water=LAST)}, "recorded once"


async def test_record_gives_way_to_a_row_already_at_the_first_slot(db: Database) -> None:
    await register(db, "manual", "other")
    await add_run(db, "manual", FIRST, status="COMPLETED", trigger="manual")
    outcomes = await passed_over.record(
        db, [passed("manual"), passed("other")], instance_id="me", now=NOW
    )
    assert outcomes["manual"] == Outcome(high_water=FIRST)
    assert outcomes["other"].execution_id is not None
    assert (await job_row(db, "manual"))["last_slot_at"] is None
    assert (await job_row(db, "other"))["last_slot_at"] == LAST
