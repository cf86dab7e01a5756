"""After the database comes back: what did it keep of what this instance wrote?

A database reached again after an outage may be another server: a standby promoted by a
failover. With synchronous replication it has every commit acknowledged to us; with
asynchronous replication the last ones can be gone (docs/explanation/design.md, "Poolers
and failovers"). Once per outage, as soon as a call succeeds again, :class:`Reconnection`:

1. reads how the server replicates (PostgreSQL) and says once, at WARNING, when a failover can
   lose claims (``/readyz``'s body and a metric say the same);
2. checks every run in flight against the rows the database has now. A run still ours whose
   chunk marker is gone gets it back. A run whose claim is gone, or now another instance's (or
   handed back), is fenced at once (``ctx.lease_lost``), announced (a WARNING and a ``FENCED``
   alert naming job and slot: "claim lost in a database failover"), and recorded ``STOPPED``
   where the database has nothing in its place, so the slot is not run again behind an
   operator's back. A run whose body had not started is quietly given back to the cluster;
3. writes again the outcomes this instance recorded in the last leases (kept in memory), so a
   finished run is never left ``RUNNING`` to hold its job, and the history says what ran.

Everything here is by a run's whole key, never by its id alone (the id sequence of a primary
that lost commits starts behind).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from datetime import datetime

from slotcron.lifeline.inflight import CancelReason, RunHandle, Runs
from slotcron.lifeline.outage import DB_ERRORS
from slotcron.lifeline.roles import Collaborators, Role
from slotcron.status import Status
from slotcron.store import failover as store
from slotcron.store import runs as run_store
from slotcron.store.claims import Claim, RunKey

log = logging.getLogger("slotcron.failover")

LOST = "its claim was lost in a database failover"
REMEMBER_LEASES = 3
"""Outcomes are kept in memory for this many leases, to be written again after a failover."""
REMEMBER_MAX = 10_000
"""At most this many outcomes are kept (the newest): memory stays bounded at any rate."""


@dataclass(frozen=True)
class Recorded:
    """An outcome this instance wrote."""

    claim: Claim
    status: str
    error: str | None
    started_at: datetime | None
    finished_at: datetime
    at: float  # monotonic


class Reconnection(Role):
    name = "reconnection check"

    def __init__(
        self,
        shared: Collaborators,
        *,
        runs: Runs,
        lease: float,
        next_slot: Callable[[str, datetime], datetime | None],
    ) -> None:
        super().__init__(shared)
        self.runs = runs
        self.window = REMEMBER_LEASES * lease
        self._next_slot = next_slot
        self._recent: deque[Recorded] = deque(maxlen=REMEMBER_MAX)
        self.counted: Collection[str] = ()
        """Jobs with ``max_runs``: a completed run written again is counted again."""
        self._wake = asyncio.Event()
        self.pending = False
        """A check is due or under way (an outage just ended): until it is done, only it judges
        whether a run is still ours, so a run whose claim the failover lost is fenced saying
        so (the heartbeat's renewal, which may come first, leaves such runs to it; time still
        fences them if the check cannot run)."""
        self._unwritten: list[store.Lost] = []
        """Rows of runs fenced for a lost claim, not written yet (the write failed: again at the
        next check)."""
        self.replication: store.Replication | None = None
        self.checks = 0
        self.fenced = 0
        """Runs fenced because the database no longer had them as ours."""
        self.restored = 0
        """Rows, markers and outcomes written again."""

    # --- what the rest of the instance tells it

    def recorded(
        self, claim: Claim, status: str, error: str | None, started_at: datetime | None
    ) -> None:
        """The outcome writer recorded ``claim``'s outcome."""
        now = time.monotonic()
        recent = self._recent
        while recent and now - recent[0].at > self.window:
            recent.popleft()
        recent.append(Recorded(claim, status, error, started_at, self.clock.now(), now))

    def remembers(self, execution_id: int) -> bool:
        """Whether the outcome of run ``execution_id`` is among those kept to be written again."""
        return any(r.claim.execution_id == execution_id for r in self._recent)

    def reconnected(self) -> None:
        """A database call succeeded after an outage: look at what the database kept."""
        self.pending = True
        self._wake.set()

    # --- the check

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                await self.check()
            except DB_ERRORS as exc:
                # A new outage: its end wakes us again.
                self.outage.failed(exc, "checking what the database kept")

    async def check(self) -> None:
        self.checks += 1
        await self.check_replication()
        await self._check_runs()
        self.pending = False  # every run in flight judged: the heartbeat judges again
        await self._write_lost()
        await self._write_outcomes_again()

    async def check_replication(self) -> store.Replication | None:
        """Read how the database replicates; say so when it changed (and at start-up)."""
        found = await store.replication(self.db)
        previous, self.replication = self.replication, found
        if found is None or (previous is not None and previous.mode == found.mode):
            return found
        if found.mode in ("asynchronous", "unknown"):
            log.warning("database replication: %s", found.describe())
        else:
            log.info("database replication: %s", found.describe())
        return found

    async def _check_runs(self) -> None:
        handles = [h for h in self.runs if h.cancel_reason is None and not h.finishing]
        if not handles:
            return
        found = await store.find_runs(self.db, [h.claim.key for h in handles])
        lost: list[RunHandle] = []
        markers: dict[str, tuple[datetime, list[RunHandle]]] = {}
        for handle in handles:
            row = found.get(handle.claim.key)
            ours = row is not None and row.status == Status.RUNNING
            ours = ours and row is not None and row.instance_id == self.instance_id
            if not ours:
                lost.append(handle)
            elif row is not None and handle.started and not row.started and row.start_key:
                if row.marker == "handed back":
                    lost.append(handle)
                elif row.marker is None:  # the chunk's start marker went with the failover
                    started = handle.started_at or handle.claim.scheduled_at
                    markers.setdefault(row.start_key, (started, []))[1].append(handle)
        if markers:
            back = await store.restore_markers(
                self.db,
                {key: started for key, (started, _) in markers.items()},
                instance_id=self.instance_id,
                now=self.clock.now(),
            )
            self.restored += len(back)
            for key, (_, chunk) in markers.items():
                if key not in back:  # handed back meanwhile: it runs elsewhere
                    lost.extend(chunk)
            if back:
                log.warning(
                    "the database had lost the start of %d chunk(s) of this instance's runs "
                    "(a failover?): written again",
                    len(back),
                )
        if lost:
            await self._fence(lost, found)

    async def _fence(self, handles: list[RunHandle], found: dict[RunKey, store.Found]) -> None:
        now = self.clock.now()
        missing: list[store.Lost] = []
        taken_back: list[RunKey] = []
        fenced: list[str] = []
        for handle in handles:
            claim = handle.claim
            if not handle.started:
                # Nothing ran: the slot is the cluster's again, as if never claimed here.
                self.runs.cancel(handle, CancelReason.HANDED_BACK)
                continue
            self.runs.cancel(handle, CancelReason.FENCED, why=LOST)
            self.fenced += 1
            fenced.append(f"{claim.job_name} slot {claim.scheduled_at.isoformat()}")
            row = found.get(claim.key)
            if row is None:
                missing.append(
                    store.Lost(
                        run=claim.key,
                        trigger=claim.trigger,
                        status=Status.STOPPED.value,
                        error=f"fenced on instance {self.instance_id}: {LOST}",
                        started_at=handle.started_at,
                        finished_at=now,
                        lease_ms=claim.lease_ms,
                        fencing_token=claim.fencing_token,
                        params=dict(claim.params),
                        next_slot=self._next_slot(claim.job_name, claim.scheduled_at),
                    )
                )
            elif row.status == Status.QUEUED:
                taken_back.append(claim.key)
        if fenced:
            log.warning(
                "after reconnecting, %d run(s) in flight here were no longer ours in the "
                "database (%s): fenced at once (ctx.lease_lost is set): %s",
                len(fenced),
                LOST,
                "; ".join(fenced[:20]) + (" ..." if len(fenced) > 20 else ""),
            )
        self._unwritten.extend(missing)
        reason = f"fenced on instance {self.instance_id}: {LOST}"
        await store.settle_lost_takes(self.db, taken_back, reason=reason, now=now)

    async def _write_lost(self) -> None:
        """Write the rows of runs fenced for a lost claim (kept until written)."""
        if self._unwritten:
            rows, self._unwritten = self._unwritten, []
            try:
                self.restored += await store.restore_rows(
                    self.db, rows, instance_id=self.instance_id, counted=self.counted
                )
            except BaseException:
                self._unwritten = rows + self._unwritten
                raise

    async def _write_outcomes_again(self) -> None:
        horizon = time.monotonic() - self.window
        recent = [r for r in self._recent if r.at >= horizon]
        if not recent:
            return
        # Still RUNNING and ours: the outcome's write was lost. Written again as it was.
        rewritten = await run_store.finish_many(
            self.db,
            [(r.claim.key, r.status, r.error) for r in recent],
            instance_id=self.instance_id,
            now=self.clock.now(),
            counted=self.counted,
        )
        found = await store.find_runs(self.db, [r.claim.key for r in recent])
        gone = [r for r in recent if r.claim.key not in found]
        restored = await store.restore_rows(
            self.db,
            [self._lost(r) for r in gone],
            instance_id=self.instance_id,
            counted=self.counted,
        )
        self.restored += len(rewritten) + restored
        if rewritten or restored:
            log.warning(
                "the database had lost %d outcome(s) and %d whole run(s) this instance recorded "
                "(a failover?): written again",
                len(rewritten),
                restored,
            )

    def _lost(self, recorded: Recorded) -> store.Lost:
        claim = recorded.claim
        return store.Lost(
            run=claim.key,
            trigger=claim.trigger,
            status=recorded.status,
            error=recorded.error,
            started_at=recorded.started_at,
            finished_at=recorded.finished_at,
            lease_ms=claim.lease_ms,
            fencing_token=claim.fencing_token,
            params=dict(claim.params),
            next_slot=self._next_slot(claim.job_name, claim.scheduled_at),
        )

    @property
    def remembered(self) -> Iterable[Recorded]:
        return iter(self._recent)
