"""A burst claimed ahead of its slot has no side effects until the slot: real processes, a
signal or a pause aimed a few milliseconds before the slot by the harness's clock, judged by
what the jobs themselves recorded.

The two instances share the jobs (each plans and claims ahead only its own share, about half);
the test strikes at ``ahead`` once every slot of a burst is claimed, its share among them, and
judges that the share runs once, elsewhere, by the jobs' own records.
"""

from __future__ import annotations

import asyncio
import math
import signal
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from slotcron.store.database import Database
from slotcron.store.tables import executions, jobs
from sqlalchemy import case, func, select, update

from tests.cluster.conftest import Spawn
from tests.cluster.harness import Instance, read_records, slot_time, wait_until

JOBS = "tests.cluster.jobs_ahead"
# Bounds of milliseconds before a slot and of lateness after a kill: each test runs while no
# other test of the run loads the machine.
pytestmark = pytest.mark.alone
N_JOBS = 400  # each instance's share about 200: claimed some 20 ms before the slot
EVERY = 5.0
LEASE = 2.0
MARGIN = 1.0  # a loaded 2-core machine: a leader's look or a queue poll may come late by this
ENV: dict[str, Any] = dict(
    AHEAD_JOBS=N_JOBS,
    AHEAD_EVERY=EVERY,
    SCHEDULER_LEASE_SECONDS=LEASE,
    SCHEDULER_HEARTBEAT_SECONDS=0.5,
    SCHEDULER_POOL_SIZE=4,
)
BACKENDS = pytest.mark.parametrize("backend", ["postgresql", "mariadb"], indirect=True)


def start_pair(spawn: Spawn, **ahead_env: Any) -> tuple[Instance, Instance]:
    ahead = spawn("ahead", JOBS, **ENV, SCHEDULER_MAX_CONCURRENCY=10_000, **ahead_env)
    other = spawn("other", JOBS, **ENV, SCHEDULER_MAX_CONCURRENCY=10_000)
    return ahead, other


def starts_of(records: list[dict[str, Any]], slot: float) -> list[dict[str, Any]]:
    return [r for r in records if r["event"] == "start" and slot_time(r["slot"]) == slot]


def next_slot(after: float) -> float:
    return math.floor(after / EVERY) * EVERY + EVERY


def wait_for_a_full_burst(path: Path) -> float:
    """Until both instances fire bursts: one slot run by every job. Returns that slot."""

    def full() -> float | None:
        by_slot = Counter(slot_time(r["slot"]) for r in read_records(path) if r["event"] == "end")
        done = [slot for slot, n in by_slot.items() if n == N_JOBS]
        return max(done) if done else None

    found: float = wait_until(full, 60, f"a burst of {N_JOBS} slots run")
    return found


def sleep_until(when: float) -> None:
    """Until ``when`` (epoch seconds) by this process's clock, to the tenth of a millisecond."""
    while (left := when - time.time()) > 0.002:
        time.sleep(left - 0.002)
    while time.time() < when:
        pass


async def aimed_slot(path: Path) -> float:
    """A slot at least one burst away, after a full burst has run: both instances are warm, and
    the lead window is sized by bursts measured since start-up."""
    await asyncio.to_thread(wait_for_a_full_burst, path)
    return next_slot(time.time() + EVERY)


async def once_claimed_by(db: Database, instance: str, slot: float, latest: float) -> bool:
    """Until ``instance``'s claims of ``slot`` are committed (it claims ahead of the slot by its
    lead window, tens of milliseconds), and every job's slot is claimed (no claim holds a job's
    row any more): True; or ``latest`` (False)."""
    await asyncio.to_thread(sleep_until, slot - 0.06)
    when = datetime.fromtimestamp(slot, UTC)
    query = select(
        func.count(), func.sum(case((executions.c.instance_id == instance, 1), else_=0))
    ).where(executions.c.scheduled_at == when)
    async with db.engine.connect() as conn:  # one connection, no transaction: fast looks
        conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
        while time.time() < latest:
            claimed, theirs = (await conn.execute(query)).one()
            # Still before ``latest`` once the answer is in: a look that took the margin (a
            # loaded machine) lets the slot pass rather than strike after it.
            if claimed == N_JOBS and theirs and time.time() < latest:
                return True
    return False


async def aim(db: Database, path: Path, instance: str, before: float = 0.003) -> float:
    """A slot that ``instance`` claimed ahead, ``before`` seconds or more before it: the moment
    to strike. Its claims commit some 10 to 40 ms before the slot, later under load: a slot
    whose claims are not in by then is let pass, and the next one aimed at."""
    slot = await aimed_slot(path)
    for _ in range(8):
        if await once_claimed_by(db, instance, slot, latest=slot - before):
            return slot
        slot += EVERY
    raise AssertionError(f"{instance} never had its claims in {before * 1000:g} ms before a slot")


async def rows_of(db: Database, slot: float) -> list[Any]:
    when = datetime.fromtimestamp(slot, UTC)
    async with db.read() as conn:
        return list(
            (await conn.execute(select(executions).where(executions.c.scheduled_at == when))).all()
        )


def assert_each_ran_once_on(
    records: list[dict[str, Any]], slot: float, instance: str
) -> list[float]:
    """Every job ran ``slot`` exactly once, on ``instance``; return how late each started."""
    started = starts_of(records, slot)
    counts = Counter(r["job"] for r in started)
    assert len(counts) == N_JOBS, f"{N_JOBS - len(counts)} slots never ran"
    assert max(counts.values()) == 1, f"slots run twice: {[j for j, n in counts.items() if n > 1]}"
    assert {r["instance"] for r in started} == {instance}
    assert {r["attempt"] for r in started} == {1}, "nothing ran: the same attempt runs"
    return [r["wall"] - slot for r in started]


def assert_no_start_after_finish(rows: list[Any]) -> None:
    backwards = [
        r.id for r in rows if r.started_at and r.finished_at and r.started_at > r.finished_at
    ]
    assert backwards == [], f"records with started_at after finished_at: {backwards}"


@BACKENDS
async def test_a_burst_claimed_ahead_by_an_instance_killed_before_its_slot_runs_elsewhere_once(
    db: Database, spawn: Spawn, records_path: Path
) -> None:
    ahead, _other = start_pair(spawn)
    # 10 ms before it, its claims in: a loaded machine may deliver the signal a few ms late.
    slot = await aim(db, records_path, "ahead", before=0.010)
    killed = time.time()
    ahead.signal(signal.SIGKILL)
    claimed = [r for r in await rows_of(db, slot) if r.instance_id == "ahead"]
    # What the test is about: the killed instance started no body of the slot (its own records).
    early = [r for r in starts_of(read_records(records_path), slot) if r["instance"] == "ahead"]
    assert early == [], f"killed after the slot ({len(early)} bodies started): aim earlier"

    def all_ran() -> bool:
        return len(starts_of(read_records(records_path), slot)) >= N_JOBS

    await asyncio.to_thread(wait_until, all_ran, LEASE + MARGIN + 5, "every slot to run")
    await asyncio.sleep(0.5)  # a second run of any slot would show by now
    late = assert_each_ran_once_on(read_records(records_path), slot, "other")
    # Its share: about half (rendezvous hashing of 400 jobs over two instances).
    assert len(claimed) >= N_JOBS / 4, f"the killed instance claimed only {len(claimed)} slots"
    assert max(late) <= LEASE + MARGIN, f"the last slot ran {max(late):.2f} s late"
    rows = await rows_of(db, slot)
    assert Counter(r.status for r in rows) == Counter({"COMPLETED": N_JOBS})
    assert_no_start_after_finish(rows)
    assert all(r.started_at is not None for r in rows)
    print(
        f"\nkilled {1000 * (slot - killed):.1f} ms before the slot: {len(claimed)}/{N_JOBS} "
        "claimed ahead by it, all ran "
        f"once elsewhere; lateness max {max(late):.2f} s"
    )


async def set_paused_before(db: Database, paused: bool, slot: float, margin: float) -> float:
    """Pause (or resume) every job so that the change commits about ``margin`` s before
    ``slot``: the statement is sent that much earlier than the slowest of three rehearsals took
    (a loaded machine commits in tens of milliseconds). Returns when it committed."""
    took = 0.0
    for _ in range(3):
        began = time.time()
        async with db.transaction() as conn:
            await conn.execute(update(jobs).values(paused=jobs.c.paused))
        took = max(took, time.time() - began)
    await asyncio.to_thread(sleep_until, slot - took - margin)
    async with db.transaction() as conn:
        await conn.execute(update(jobs).values(paused=paused))
    return time.time()


async def toggle_before_a_slot(db: Database, paused: bool) -> tuple[float, float]:
    """Pause or resume every job ~5 ms before a slot: the slot and when the change committed.
    A change that commits after its slot (the jobs' rows were locked by a claim for longer
    than the rehearsals took, or the machine was busy) judges nothing: it is undone and a later
    slot aimed at, each time twice as early (5, 10, 20 ... 160 ms: all well inside the second
    a burst is claimed ahead)."""
    for attempt in range(6):
        slot = next_slot(time.time() + 1.0)
        committed = await set_paused_before(db, paused, slot, 0.005 * 2**attempt)
        if committed < slot:
            return slot, committed
        async with db.transaction() as conn:
            await conn.execute(update(jobs).values(paused=not paused))
    raise AssertionError("never committed before a slot")


@BACKENDS
async def test_a_pause_committed_just_before_a_burst_claimed_ahead_is_honoured_by_every_slot(
    db: Database, spawn: Spawn, records_path: Path
) -> None:
    start_pair(spawn)
    await aimed_slot(records_path)
    slot, committed = await toggle_before_a_slot(db, True)
    claimed_before = len(await rows_of(db, slot))  # claimed ahead before the pause: most
    # Claimed ahead while paused, a slot is not decided yet: a resume ~5 ms before it counts.
    resumed_for, resumed = await toggle_before_a_slot(db, False)

    def ran_after_resume() -> bool:
        return len(starts_of(read_records(records_path), resumed_for)) >= N_JOBS

    await asyncio.to_thread(wait_until, ran_after_resume, 10, "every slot after the resume")
    records = read_records(records_path)
    assert starts_of(records, slot) == [], "a slot ran although its job was paused before it"
    paused = await rows_of(db, slot)
    assert Counter(r.status for r in paused) == Counter({"SKIPPED": N_JOBS})
    assert {r.error for r in paused} == {"job is paused"}
    assert all(r.started_at is None for r in paused)
    await asyncio.sleep(0.5)
    counts = Counter(r["job"] for r in starts_of(read_records(records_path), resumed_for))
    assert len(counts) == N_JOBS and max(counts.values()) == 1
    print(
        f"\npause {1000 * (slot - committed):.1f} ms before the slot ({claimed_before} of its "
        f"slots claimed ahead by then): {N_JOBS}/{N_JOBS} SKIPPED; resume "
        f"{1000 * (resumed_for - resumed):.1f} ms before a later one: {N_JOBS}/{N_JOBS} ran"
    )


@BACKENDS
async def test_sigterm_with_no_drain_just_before_the_slot_hands_the_burst_to_another_instance(
    db: Database, spawn: Spawn, records_path: Path
) -> None:
    ahead, _other = start_pair(spawn, SCHEDULER_SHUTDOWN_DRAIN_TIMEOUT=0)
    # Early enough for its shutdown to begin before the slot: a run whose slot comes first
    # starts there (and, instant, completes) rather than being handed back.
    slot = await aim(db, records_path, "ahead", before=0.012)
    ahead.signal(signal.SIGTERM)
    signalled = time.time()
    assert signalled < slot, "signalled after the slot: the test aims before it"
    claimed = [r for r in await rows_of(db, slot) if r.instance_id == "ahead"]
    code = await asyncio.to_thread(ahead.wait, 20)
    assert code == 0, ahead.log()

    def all_ran() -> bool:
        return len(starts_of(read_records(records_path), slot)) >= N_JOBS

    await asyncio.to_thread(wait_until, all_ran, 10, "every slot to run")
    await asyncio.sleep(0.5)
    records = read_records(records_path)
    started = starts_of(records, slot)
    late = assert_each_ran_once_on(records, slot, "other")
    assert len(claimed) >= N_JOBS / 4, f"the stopped instance claimed only {len(claimed)} slots"
    rows = await rows_of(db, slot)
    assert Counter(r.status for r in rows) == Counter({"COMPLETED": N_JOBS})
    async with db.read() as conn:
        every_row = list((await conn.execute(select(executions))).all())
    assert_no_start_after_finish(every_row)
    stopped = [r for r in every_row if r.status == "STOPPED" and r.started_at is None]
    assert stopped == [], "a STOPPED record for a run that never started"
    print(
        f"\nSIGTERM {1000 * (slot - signalled):.1f} ms before the slot, no drain: "
        f"{len(claimed)}/{N_JOBS} claimed ahead by it; {len(started)}/{N_JOBS} ran once on the "
        f"other instance; lateness max {max(late):.2f} s"
    )
