"""Claiming a slot, with the patience the NOWAIT lock needs.

A busy row is not a lost slot: someone else is claiming this job right now. We back off a few
milliseconds and re-read; if the slot is still open we try again, up to :data:`BUSY_DEADLINE`.
A database outage is retried with backoff and logged once.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, NotRequired, TypedDict, Unpack

from slotcron.engine.supersession import Supersession
from slotcron.errors import LeaseHeld, RowBusy, RunsExhausted, SlotTaken, Superseded
from slotcron.jobs.calendars import excluded
from slotcron.jobs.registry import Job
from slotcron.lifeline.outage import DB_ERRORS, Backoff, resume_cancellation
from slotcron.lifeline.roles import Collaborators
from slotcron.observe.logs import run_fields
from slotcron.status import Status
from slotcron.store import batch as batch_store
from slotcron.store import claims as claim_store
from slotcron.store.batch import Decided, Due
from slotcron.store.claims import Claim

log = logging.getLogger("slotcron.claims")

OPEN_READ_SECONDS = 2.0
"""How long the read of a chunk's open slots may take (:meth:`Claimer.open_among`): it only
saves claiming what another instance took, and must not add a hang's wait to the claim's."""

BUSY_DEADLINE = 30.0
"""Seconds a claimer keeps retrying a busy row before leaving the slot to the misfire policy."""


LEASE_RECHECK_MIN, LEASE_RECHECK_MAX = 0.02, 0.1
"""Seconds between looks at a lease a waiting catch-up claim wants (spread, so that several
instances waiting for one run do not look in step)."""

HELD_TOGETHER = 0.5
"""Of the time a batch has until it gives up, the part it spends retrying rows another claimer
held together (re-reading first which are still open), before each remaining one is retried on
its own (with NOWAIT) by :meth:`Claimer.claim`. Another instance's chunk holds its rows for tens
of milliseconds, hundreds under load: thousands of claims one by one would fall behind."""
HELD_TRIES_MAX = 100

RETRIED: tuple[type[BaseException], ...] = (LeaseHeld, RowBusy, *DB_ERRORS)
"""What a claim waits out and tries again (:meth:`Claimer._again`), until its deadline."""


class ClaimAsk(TypedDict):
    """How one slot is claimed: the keywords :meth:`Claimer.claim` and the firing's ``claim``
    (which adds the slot's ``following``) both take.

    ``trigger``: what started it (cron, catchup, ...). ``missed_reason``: record the slot
    ``MISSED`` for this reason instead of running it. ``check_gap`` (default true): refuse with
    :class:`SlotsUndecided` when earlier slots of the job were never decided. ``give_up_at``:
    stop trying then, by the scheduler's clock (default :data:`BUSY_DEADLINE` from now).
    ``wait_for_lease`` (seconds): a ``forbid`` job's slot that finds a run holding the lease
    waits up to this long for it to end instead of being recorded ``SKIPPED`` at once;
    ``behind`` (default ``"any"``): ``"catchup"`` waits only for a catch-up run's lease."""

    trigger: str
    missed_reason: NotRequired[str | None]
    check_gap: NotRequired[bool]
    give_up_at: NotRequired[datetime | None]
    wait_for_lease: NotRequired[float | None]
    behind: NotRequired[str]


@dataclass
class _Tries:
    """How one claim's retries went so far."""

    busy: int = 0
    backoff: Backoff = field(default_factory=lambda: Backoff(jitter=0.5))


@dataclass
class ClaimStats:
    claims: int = 0
    batches: int = 0
    taken: int = 0
    busy_retries: int = 0
    gave_up: int = 0


class Claimer:
    def __init__(
        self, shared: Collaborators, *, default_lease: float, timezone: str = "UTC"
    ) -> None:
        self.events = shared.events
        self.db = shared.db
        self.clock = shared.clock
        self.instance_id = shared.instance_id
        self.outage = shared.outage
        self.default_lease = default_lease
        self.timezone = timezone
        """The zone of a job that names none: the day its calendar judges a slot by."""
        self.counted: set[str] = set()
        """Jobs with ``max_runs``, whose completed runs are counted (the outcomes' writers
        read it: slotcron.store.counted)."""
        self.exhausted: set[str] = set()
        """Jobs whose ``max_runs`` completed: the planners plan them no more."""
        self.stats = ClaimStats()
        self.closing = False
        self.supersession: Supersession | None = None
        """Set by the service: the fingerprint each claim presents, and what to do when a
        claim is refused because a newer registration changed the job's schedule."""

    async def claim(
        self, job: Job, slot: datetime, *, following: datetime, **ask: Unpack[ClaimAsk]
    ) -> Claim | None:
        """The slot's record if this instance decided its fate, or None if another did (or it
        could not be claimed before the deadline, or this instance is shutting down). How it
        claims: :class:`ClaimAsk`.

        Raises :class:`SlotsUndecided` (with ``check_gap``) when earlier slots of the job were
        never decided: the caller accounts for them first. A slot not decided by its
        ``give_up_at`` is left undecided, for the misfire policy to account for."""
        deadline = ask.get("give_up_at") or self.clock.now() + timedelta(seconds=BUSY_DEADLINE)
        wait_for_lease = ask.get("wait_for_lease")
        waiting_until = None if wait_for_lease is None else time.monotonic() + wait_for_lease
        behind = ask.get("behind", "any")
        request = self._request(
            job,
            slot,
            ask["trigger"],
            following,
            ask.get("missed_reason"),
            ask.get("check_gap", True),
        )
        tries = _Tries()
        self.events.claim_began()
        while not self.closing:
            sent = self.clock.monotonic()
            waiting = waiting_until is not None and time.monotonic() < waiting_until
            try:
                claim = await claim_store.claim_slot(
                    self.db,
                    now=self.clock.now(),
                    wait_for_lease=behind if waiting else None,
                    **request,
                )
            except Superseded:
                self.outage.recovered()
                if self.supersession is not None:
                    await self.supersession.refused([job.name])
                return None
            except SlotTaken:
                self.outage.recovered()
                self.stats.taken += 1
                return None
            except RunsExhausted:
                self.outage.recovered()
                self._exhausted(job)
                return None
            except RETRIED as exc:
                if not await self._again(exc, job, deadline, tries):
                    break
                continue
            self.outage.recovered()
            self.stats.claims += 1
            self._recorded(claim)
            return replace(claim, sent=sent)
        if not self.closing:
            self._gave_up(job, slot, tries.busy)
        return None

    def _request(
        self,
        job: Job,
        slot: datetime,
        trigger: str,
        following: datetime,
        missed_reason: str | None,
        check_gap: bool,
    ) -> dict[str, Any]:
        """What every attempt of one slot's claim asks (the moment and the lease wait apart)."""
        if job.max_runs is not None:
            self.counted.add(job.name)
        return {
            "job_name": job.name,
            "slot": slot,
            "trigger": trigger,
            "instance_id": self.instance_id,
            "lease_ms": job.lease_ms(self.default_lease),
            "forbid_overlap": job.overlap == "forbid",
            "following": following,
            "missed_reason": missed_reason,
            "excluded": self.excluded(job, slot),
            "max_runs": job.max_runs,
            "check_gap": check_gap,
            "fingerprint": self.fingerprint(job),
            # A jittered run's body starts later: its start is stamped then.
            "started": not job.jitter,
        }

    def _exhausted(self, job: Job) -> None:
        if job.name not in self.exhausted:
            self.exhausted.add(job.name)
            log.info(
                "%s completed its max_runs=%s: no slot of it is planned any more",
                job.name,
                job.max_runs,
            )

    def excluded(self, job: Job, slot: datetime) -> str | None:
        """Why ``slot`` is recorded SKIPPED by the job's calendar or excluded dates, or None."""
        return excluded(job, slot, job.timezone or self.timezone)

    async def _again(self, exc: BaseException, job: Job, deadline: datetime, tries: _Tries) -> bool:
        """After a claim found the lease held, the row busy, or the database failing: wait a
        moment and say whether to try again (False past ``deadline``)."""
        if isinstance(exc, LeaseHeld):
            # An earlier slot's run holds the lease (here or on another instance): look again
            # in a moment of real time (runs end by the real clock, not a test's).
            self.outage.recovered()
            await asyncio.sleep(random.uniform(LEASE_RECHECK_MIN, LEASE_RECHECK_MAX))
            return True
        if isinstance(exc, RowBusy):
            self.outage.recovered()
            tries.busy += 1
            self.stats.busy_retries += 1
            if self.clock.now() > deadline:
                return False
            await asyncio.sleep(random.uniform(0.001, 0.004) * min(tries.busy, 8))
            return True
        self.outage.failed(exc, f"claiming {job.name}")
        if self.clock.now() > deadline:
            return False
        await tries.backoff.wait()
        return True

    def _gave_up(self, job: Job, slot: datetime, busy: int) -> None:
        self.stats.gave_up += 1
        # While the database is out (or read-only: logged once already), not once per slot.
        quiet = self.outage.ongoing or self.db.read_only
        log.log(
            logging.DEBUG if quiet else logging.WARNING,
            "could not claim %s slot %s in time (%d busy retries); the misfire policy "
            "accounts for it",
            job.name,
            slot.isoformat(),
            busy,
        )

    async def open_among(self, items: list[Due]) -> list[Due] | None:
        """The items whose slot no instance has decided yet, by a plain read that locks and
        writes nothing; None when the database does not say within :data:`OPEN_READ_SECONDS`
        (the claims decide, as they would have)."""
        try:
            async with asyncio.timeout(OPEN_READ_SECONDS):
                open_ = await batch_store.open_among(self.db, items)
        except DB_ERRORS as exc:
            resume_cancellation(exc)
            return None
        except TimeoutError:
            return None
        self.stats.taken += len(items) - len(open_)
        return open_

    async def claim_many(self, items: list[Due], *, give_up_at: datetime) -> Decided:
        """Decide many slots together, in one transaction (and retries of held rows).

        Whatever is returned in ``held`` was never decided and must be claimed one by one;
        ``undecided`` jobs have earlier slots to account for first. Slots still undecided at
        ``give_up_at`` (an outage) are returned in ``held`` as well, for the same path, which
        leaves them to the misfire policy. A job with ``max_runs`` is returned in ``held`` at
        once: its runs in flight are counted by a claim of its own (slotcron.store.counted)."""
        result = Decided()
        alone = [item for item in items if item.max_runs is not None]
        pending = [item for item in items if item.max_runs is None] if alone else items
        tries = 0
        backoff = Backoff(jitter=0.5)
        start = self.clock.now()
        together_until = start + (give_up_at - start) * HELD_TOGETHER
        self.events.claim_began()
        # A claim under way finishes (shutdown's phase 1): its first attempt is made even once
        # this instance is closing, only its retries are not. A burst's chunks not yet sent
        # when a SIGTERM came a few milliseconds after their slot were left undecided: up to
        # 75 slots of 330 claimed by the other members only past their grace (MISSED).
        first = True
        while pending and (first or not self.closing):
            first = False
            sent = self.clock.monotonic()
            try:
                decided = await batch_store.claim_many(
                    self.db,
                    pending,
                    instance_id=self.instance_id,
                    now=self.clock.now(),
                )
            except RowBusy:  # SQLite: another process is writing
                self.outage.recovered()
                self.stats.busy_retries += 1
                decided = Decided(held=pending)
            except DB_ERRORS as exc:
                self.outage.failed(exc, f"claiming {len(pending)} slots")
                if self.clock.now() > give_up_at:
                    break
                await backoff.wait()
                continue
            self.outage.recovered()
            await self._decided(decided, result, sent)
            pending = decided.held
            if not pending:
                break
            tries += 1
            if self.clock.now() > together_until or tries > HELD_TRIES_MAX:
                break
            # Held by another claimer, whose transaction is short. Retry together; the ones it
            # decided meanwhile are simply closed.
            self.stats.busy_retries += len(pending)
            await asyncio.sleep(min(random.uniform(0.002, 0.006) * tries, 0.05))
            pending = await self._still_open(pending, result)
        result.held = pending + alone if alone else pending
        return result

    async def _decided(self, decided: Decided, result: Decided, sent: float) -> None:
        """Take in what one batch's transaction decided (counted, announced, kept)."""
        if decided.superseded and self.supersession is not None:
            await self.supersession.refused(decided.superseded)
        self.stats.batches += 1
        self.stats.claims += len(decided.claims)
        self.stats.taken += len(decided.taken)
        for name, claim in decided.claims.items():
            self._recorded(claim)
            # Stamped in place: the claim is this batch's own new object, nobody else holds
            # it yet; a copy per run (dataclasses.replace) cost 8 us each, 80 ms a burst
            # of 10,000 on a 2-core machine, most of what issue 11 added to its claims.
            object.__setattr__(claim, "sent", sent)
            result.claims[name] = claim
        result.taken |= decided.taken
        result.undecided += decided.undecided
        result.expected.update(decided.expected)
        result.deferred += decided.deferred
        result.start_keys.update(decided.start_keys)

    async def _still_open(self, pending: list[Due], result: Decided) -> list[Due]:
        """Of ``pending`` (rows another claimer held), those still open: the ones it decided
        meanwhile are simply closed (``pending`` as it was when the read fails)."""
        try:
            open_ = await batch_store.still_open(self.db, pending)
        except DB_ERRORS as exc:
            resume_cancellation(exc)
            return pending
        closed = {i.job_name for i in pending} - {i.job_name for i in open_}
        result.taken |= closed
        self.stats.taken += len(closed)
        return open_

    def fingerprint(self, job: Job) -> str | None:
        """What this instance's claims of ``job`` present as the schedule they fire, refused
        if another is in force: a runtime schedule's version, the one this job was built from
        (:class:`slotcron.engine.runtime.ScheduledJob`); a code job's fingerprint as registered.
        None:
        none."""
        mark: str | None = getattr(job, "mark", None)
        if mark is not None:
            return mark
        return self.supersession.fingerprints.get(job.name) if self.supersession else None

    def _recorded(self, claim: Claim) -> None:
        """Announce what this claim decided (a slot recorded not run is an event: counted,
        alerted, logged by :mod:`slotcron.observe`)."""
        if claim.status == Status.RUNNING and log.isEnabledFor(logging.DEBUG):
            # The common case costs one level check.
            fields = run_fields(
                claim.job_name,
                claim.scheduled_at,
                claim.execution_id,
                self.instance_id,
                claim.status,
            )
            log.debug("%s slot %s claimed", claim.job_name, claim.scheduled_at, extra=fields)
        self.events.claimed(claim)
