"""Claiming many slots together: the burst claimer.

Jobs due at the same moment are claimed in a few transactions (chunks of :data:`BATCH_SIZE`,
:data:`CHUNKS_IN_FLIGHT` at once), ahead of their slot by the lead window (:meth:`Burst.lead`:
what claiming them is measured to take), and each chunk's runs then start at their slot, once
one marker per chunk has recorded their start (:mod:`slotcron.engine.kickoff`): until then, a run
claimed ahead
has not started, can be handed back to another instance, and honours a pause.
Only as many slots are claimed as there are capacity permits; the rest wait for permits and
are claimed together in turn. Whatever a batch could not decide goes on, one by one, through
:meth:`slotcron.engine.firing.Firing.fire`; gaps of ``misfire="skip"`` jobs and late slots are
recorded
``MISSED`` many jobs per transaction.

Permits (:mod:`slotcron.engine.permits`): one is taken per slot before its claim, and given back
when its
run ends or at once when the slot does not run here; a chunk cancelled (shutdown) gives back
all of its own. Slots claimed ahead of their time are claimed under ahead permits, and each of
their runs takes a run permit only once its slot has come (:meth:`Firing.start_run`): runs
waiting for their slot hold nothing a job due before it needs.

A burst shared by several instances costs each about its share: every instance cuts the burst
into the same chunks (by slot and name), takes them in its own order, and once a chunk comes
back with slots another instance took, reads each later chunk's open slots first (a plain read,
no lock) and claims only those. Claiming all 100,000 slots of a shared burst, as each instance
did before, took each of three instances 17-28 s of a 15 s lead.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Mapping
from datetime import datetime, timedelta

from slotcron.clock import Clock
from slotcron.engine import missed_slots
from slotcron.engine.claims import Claimer
from slotcron.engine.firing import Firing
from slotcron.engine.permits import Tokens
from slotcron.jobs import misfire
from slotcron.jobs.registry import Job
from slotcron.schedule.slots import Schedule
from slotcron.status import Status
from slotcron.store.batch import Decided, Due
from slotcron.store.claims import Claim

log = logging.getLogger("slotcron.scheduler")

BATCH_SIZE = 500
"""Slots decided per claim transaction. A larger burst is split into chunks."""
CHUNKS_IN_FLIGHT = 2

LEAD_BASE = 0.02
"""Seconds ahead of their time that slots due together are claimed, plus the measured cost of
claiming each of them: their runs then start on time instead of as their chunk is decided. A
loop on a loaded 2-core machine wakes a few milliseconds late; 10 ms left the claims of a
shared burst (each instance claiming its share, some 200 slots) committing within the last
10 ms before their slot."""
LEAD_MAX = 1.0
"""Seconds of lead past which a runtime schedules' burst is sized by their own preparing cost
too (:mod:`slotcron.engine.horizon`)."""
LEAD_SAFETY = 1.5
"""How much more than the measured cost of claiming and preparing a burst its lead is:
claiming ahead has no side effect, claiming late is every late slot's start lag."""
CLAIM_COST_FIRST = 150e-6
"""Seconds per slot claimed together, until measured on this instance (a 2-core machine,
PostgreSQL on loopback, 2026-11-28: 10,000 slots due together claimed in 1.48 s)."""


class Burst:
    def __init__(
        self,
        schedules: Mapping[str, Schedule],
        *,
        clock: Clock,
        claimer: Claimer,
        firing: Firing,
    ) -> None:
        self.schedules = schedules
        self.clock = clock
        self.claimer = claimer
        self.firing = firing
        self.permits = firing.permits
        self._claim_cost = CLAIM_COST_FIRST
        self.claiming = 0
        """Bursts being claimed now (:meth:`fire_together`)."""
        # Chunks in flight at once: two keep both the database and this loop busy; more would
        # interleave on the loop, and every chunk (not only the last) would finish late.
        self._chunks = asyncio.Semaphore(CHUNKS_IN_FLIGHT)

    @property
    def claim_cost(self) -> float:
        """Seconds per slot that claiming a burst was last measured to take (a first guess
        until then)."""
        return self._claim_cost

    def lead(self, together: int, period: timedelta) -> timedelta:
        """How far ahead of their slot to claim ``together`` slots due at once, of jobs whose
        period is ``period``: none for a lone job; else what claiming them all is measured to
        take (:data:`LEAD_SAFETY` times), at most half a period (the previous slot's
        runs have had time to end: a forbid job's slot claimed while its lease is held is
        deferred, and claimed again at its time)."""
        if together < 2:
            return timedelta(0)
        half_period = period.total_seconds() / 2
        # With a margin on the measure, whatever the burst's size: the cost of claiming a burst
        # varies by tens of percent from one to the next (10,000 slots under a lead capped at a
        # second: 1% of them started 0.5 s late; 1,000 with a margin of 20 ms: prepared up to
        # 17 ms past their slot).
        wanted = LEAD_BASE + together * self._claim_cost * LEAD_SAFETY
        return timedelta(seconds=min(wanted, half_period))

    async def fire_together(
        self, due: list[tuple[Job, datetime]], *, held_together: bool = True
    ) -> None:
        """Claim every slot due at once in a few transactions, then start each run in its own
        task, as far as permits go; the rest wait for permits and are claimed in turn. Slots
        whose rows stayed held by another claimer are claimed together once more
        (``held_together``), then one by one."""
        self.claiming += 1
        try:
            await self._fire_together(due, held_together)
        finally:
            self.claiming -= 1

    async def _fire_together(self, due: list[tuple[Job, datetime]], held_together: bool) -> None:
        shared = _Shared(held_together)
        if len(due) > BATCH_SIZE:
            # Every instance cuts the same chunks and takes them in its own order: instances
            # that share the burst claim different chunks, not the same rows in the same order,
            # and the chunks one took are the ones the others find closed.
            due = sorted(due, key=lambda d: (d[1], d[0].name))
            chunks = [due[i : i + BATCH_SIZE] for i in range(0, len(due), BATCH_SIZE)]
            random.Random(self.claimer.instance_id).shuffle(chunks)
            due = [entry for chunk in chunks for entry in chunk]
        first = min(slot for _, slot in due)
        deadline = (first + misfire.grace(self.schedules[due[0][0].name], first)).timestamp()
        while due:
            # Ahead of their slot, runs are claimed under ahead permits: they hold no run
            # permit another job needs before their slot (slotcron.engine.permits).
            tokens: Tokens = self.permits.ahead if first > self.clock.now() else self.permits.run
            permitted = await tokens.take_up_to(len(due), deadline)
            batch, due = due[:permitted], due[permitted:]
            # In chunks claimed concurrently: the first runs start while the database is still
            # deciding later chunks, and no transaction holds thousands of rows.
            chunks = [batch[i : i + BATCH_SIZE] for i in range(0, len(batch), BATCH_SIZE)]
            began = time.perf_counter()
            await asyncio.gather(
                *(self._claim_together(chunk, tokens, shared=shared) for chunk in chunks)
            )
            # Then one turn of the loop: each run started runs up to its kick-off (its handle,
            # context and lease bookkeeping, tens of microseconds a run). That is part of what
            # the lead must cover: 1,000 runs prepared past their slot delayed the kick-off's
            # marker by 17 ms, and every body with it.
            await asyncio.sleep(0)
            cost = (time.perf_counter() - began) / len(batch)
            # What the next burst's lead is sized by: recent bursts weigh most.
            self._claim_cost = min(max(0.7 * self._claim_cost + 0.3 * cost, 5e-6), 1e-3)

    async def _claim_together(
        self,
        batch: list[tuple[Job, datetime]],
        tokens: Tokens,
        *,
        check_gap: bool = True,
        shared: _Shared | None = None,
    ) -> None:
        """Claim ``batch`` under permits (``tokens``) already taken, one per slot."""
        try:
            await self._chunks.acquire()
        except BaseException:  # cancelled while waiting its turn (shutdown)
            tokens.give_back(len(batch))
            raise
        try:
            await self._claim_chunk(batch, check_gap, shared or _Shared(), tokens)
        finally:
            self._chunks.release()

    async def _claim_chunk(
        self, batch: list[tuple[Job, datetime]], check_gap: bool, shared: _Shared, tokens: Tokens
    ) -> None:
        jobs = {job.name: job for job, _ in batch}
        # Jobs mostly share a few schedules: each one's next slot and grace, once per chunk.
        ends: dict[tuple[int, datetime], datetime] = {}
        following: dict[tuple[int, datetime], datetime] = {}
        items = []
        for job, slot in batch:
            schedule = self.schedules[job.name]
            of = (id(schedule), slot)
            after = following.get(of)
            if after is None:
                after = following[of] = schedule.next_after(slot)
                ends[of] = slot + misfire.grace(schedule, slot)
            items.append(self._due(job, slot, check_gap, after))
        give_up_at = min(ends.values())
        try:
            if shared.with_others and shared.readable:
                # Another instance claims this burst too: only the slots it has not decided.
                # A read costs a few milliseconds; claiming 500 slots it decided cost this
                # instance 50-450 ms, for nothing.
                open_ = await self.claimer.open_among(items)
                if open_ is None:  # the database did not say: claim, and read no more
                    shared.readable = False
                else:
                    tokens.give_back(len(items) - len(open_))
                    items = open_
            decided = await self.claimer.claim_many(items, give_up_at=give_up_at)
        except BaseException:
            tokens.give_back(len(items))
            raise
        if decided.taken - decided.superseded:
            shared.with_others = True
        self._act_on(decided, jobs, ends, tokens, shared.held_together)

    def _act_on(
        self,
        decided: Decided,
        jobs: dict[str, Job],
        ends: dict[tuple[int, datetime], datetime],
        tokens: Tokens,
        held_together: bool,
    ) -> None:
        """What a chunk's claim decided: its runs started (those claimed ahead at their slot),
        its permits given back for what it did not run, undecided slots claimed again one by
        one, held ones together once more (``held_together``, else one by one), deferred ones
        together at their slot."""
        ahead: dict[tuple[datetime, str], list[Claim]] = {}
        for name, claim in decided.claims.items():
            if claim.status == Status.RUNNING and not claim.started:
                key = decided.start_keys[name]
                ahead.setdefault((claim.scheduled_at, key), []).append(claim)
        # Claimed ahead, they start together at their slot: one marker per chunk and slot says
        # they started, and SKIPPED records those whose job was paused meanwhile
        # (slotcron.engine.kickoff).
        starts: dict[int, asyncio.Future[bool]] = {}
        for (slot, key), claims in ahead.items():
            starts |= self.firing.runner.kickoff.at(slot, claims, key)
        claimed_ahead = tokens is self.permits.ahead
        for name, claim in decided.claims.items():
            if claim.status == Status.RUNNING:
                job = jobs[name]
                end = ends[id(self.schedules[name]), claim.scheduled_at]
                self.firing.start_run(
                    job, claim, end, starts.get(claim.execution_id), ahead=claimed_ahead
                )
                continue
            tokens.give_back()  # SKIPPED: logged and counted by the claimer
        tokens.give_back(len(decided.taken))
        gaps: list[tuple[Job, datetime]] = []
        for item in decided.undecided:
            job = jobs[item.job_name]
            if job.misfire == "skip":  # many at once after an overload: together, in order
                gaps.append((job, item.slot))
                continue
            tokens.give_back()
            self.firing.spawn(self.firing.fire(job, item.slot), job)
        if gaps:  # keeping their permits
            closing = self._close_gaps(gaps, decided.expected, tokens, held_together)
            self.firing.spawn(closing, None)
        if decided.held:
            tokens.give_back(len(decided.held))
            held = [(jobs[item.job_name], item.slot) for item in decided.held]
            self._claim_held(held, held_together)
        if decided.deferred:
            # Claimed again at their slot, under the permits a claim at its slot takes.
            tokens.give_back(len(decided.deferred))
            deferred = [(jobs[item.job_name], item.slot) for item in decided.deferred]
            self.firing.spawn(self._claim_at_slot(deferred), None)

    def _claim_held(self, held: list[tuple[Job, datetime]], held_together: bool) -> None:
        """Claim again the slots whose rows stayed held past the claim's own retries: together
        once more (``held_together``), then one by one. Under overload they are held by this
        instance's own transaction recording missed slots of the same jobs; claimed one by one,
        a thousand a second put an instance further behind every second (19,900 of 20,000
        slots MISSED in the scaling workload)."""
        if held_together and len(held) > 1:
            self.firing.spawn(self.fire_together(held, held_together=False), None)
            return
        for job, slot in held:
            self.firing.spawn(self.firing.fire(job, slot), job)

    async def _claim_at_slot(self, batch: list[tuple[Job, datetime]]) -> None:
        """Claim together, once their time has come, the slots a batch claimed ahead deferred
        (a forbid job's lease was still held): under load there may be thousands, and one
        claim each would put the instance further behind."""
        await self.clock.sleep_until(max(slot for _, slot in batch))
        await self.fire_together(batch)

    async def _close_gaps(
        self,
        batch: list[tuple[Job, datetime]],
        expected: Mapping[str, datetime],
        tokens: Tokens,
        held_together: bool,
    ) -> None:
        """Record MISSED, together, the slots of ``misfire="skip"`` jobs that no instance
        decided before ``batch``'s (claims that gave up under overload, say), then claim the
        batch's slots together: one job at a time, thousands of such gaps would put this
        instance further behind, and leave more gaps at the next slot."""
        try:
            now = self.clock.now()
            # Slots older than catchup_window first, one range per job (issue 12, item 4).
            passed = [
                (job, p)
                for job, slot in batch
                if (p := self.firing.passed_over(job, expected[job.name], slot, now))
            ]
            await self.firing.pass_over(passed, now)
            missed = [
                (
                    job,
                    misfire.undecided_before(
                        job, self.schedules[job.name], expected[job.name], slot, now
                    ),
                )
                for job, slot in batch
            ]
            await missed_slots.record(self.firing, missed, now, BATCH_SIZE)
            if count := sum(len(late) for _, late in missed):
                log.warning(
                    "%d slots of %d jobs were never claimed (no live instance, no database, or "
                    "an overloaded one): recorded MISSED (misfire='skip')",
                    count,
                    len(missed),
                )
        except BaseException:
            tokens.give_back(len(batch))
            raise
        # Their gaps are decided (or were older than catchup_window, passed over): no new check.
        shared = _Shared(held_together)
        await self._claim_together(batch, tokens, check_gap=False, shared=shared)

    def _due(
        self, job: Job, slot: datetime, check_gap: bool = True, following: datetime | None = None
    ) -> Due:
        return Due(
            job_name=job.name,
            slot=slot,
            following=following or self.schedules[job.name].next_after(slot),
            trigger=job.trigger,
            lease_ms=job.lease_ms(self.claimer.default_lease),
            forbid_overlap=job.overlap == "forbid",
            excluded=self.claimer.excluded(job, slot),
            max_runs=job.max_runs,
            check_gap=check_gap,
            fingerprint=self.claimer.fingerprint(job),
        )


class _Shared:
    """What the chunks of one burst learn as they are claimed: whether another instance claims
    it too (a chunk came back with slots already taken)."""

    with_others = False
    readable = True
    """False once a read of open slots failed or hung: the burst's later chunks are claimed
    without one (a hanging database must not cost each chunk a read's wait on top)."""

    def __init__(self, held_together: bool = True) -> None:
        self.held_together = held_together
        """Whether slots whose rows stayed held are claimed together once more (not when these
        are such slots already)."""
