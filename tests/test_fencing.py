"""Fencing by time: a run's right to go on is a deadline on the local monotonic clock, moved
only by confirmed renewals, and measured from when each renewal was *sent*
(docs/explanation/guarantees.md, guarantee 7). Driven here by the manual clock."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import slotcron.store.runs
from slotcron.clock import ManualClock
from slotcron.jobs.registry import Registry, every
from slotcron.lifeline.fencing import Fencing
from slotcron.lifeline.heartbeat import Heartbeat
from slotcron.lifeline.inflight import CancelReason, RunHandle, Runs, margin, trusted_until
from slotcron.lifeline.roles import Collaborators
from slotcron.store.claims import Claim
from slotcron.store.database import Database
from sqlalchemy.engine import make_url

T0 = datetime(2030, 1, 1, tzinfo=UTC)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture
def shared(tmp_path: Path, clock: ManualClock) -> Collaborators:
    url = make_url(f"sqlite+aiosqlite:///{tmp_path / 'unused.db'}")
    return Collaborators(db=Database.connect(url, 1), clock=clock, instance_id="me")


def handle(lease_ms: int, sent: float) -> RunHandle:
    registry = Registry()

    @every(seconds=10, name="job", registry=registry)
    async def job() -> None: ...

    claim = Claim(1, "job", T0, "interval", "RUNNING", 1, T0, lease_ms, sent=sent)
    job_ = registry.get("job")
    assert job_ is not None
    return RunHandle(
        claim=claim,
        job=job_,
        task=None,
        deadline=trusted_until(sent, lease_ms),
        lease_ms=lease_ms,
    )


def test_the_margin_is_a_tenth_of_the_lease_between_50_ms_and_1_s() -> None:
    assert margin(3_000) == pytest.approx(0.3)
    assert margin(60_000) == 1.0
    assert margin(200) == 0.05
    assert trusted_until(100.0, 3_000) == pytest.approx(102.7)


async def test_a_run_past_its_deadline_is_fenced_and_its_lease_lost_is_set(
    clock: ManualClock, shared: Collaborators
) -> None:
    runs = Runs()
    run = handle(3_000, sent=clock.monotonic())
    runs.add(run)
    fencing = Fencing(shared, runs=runs)
    await clock.advance(2.6)
    assert fencing.fence_expired() == 0 and run.cancel_reason is None
    await clock.advance(0.2)  # 2.8 s after the claim was sent: past 3 s less 0.3 s
    assert fencing.fence_expired() == 1
    assert run.cancel_reason is CancelReason.FENCED and run.lease_lost.is_set()


async def test_a_run_added_after_a_look_is_fenced_at_its_own_deadline_even_if_earlier(
    clock: ManualClock, shared: Collaborators
) -> None:
    """The fencer skips looking at every run until the earliest deadline it knows of has
    passed; a run added since with an earlier deadline (a shorter lease) is still fenced on
    time, and a renewed run is looked at again when its old deadline passes."""
    looks: list[int] = []

    class CountedRuns(Runs):
        def __iter__(self) -> Iterator[RunHandle]:
            looks.append(len(self))
            return super().__iter__()

    runs = CountedRuns()
    long = handle(60_000, sent=clock.monotonic())
    runs.add(long)
    fencing = Fencing(shared, runs=runs)
    assert fencing.fence_expired() == 0  # knows of one deadline: 59 s from now
    await clock.advance(1)
    assert fencing.fence_expired() == 0
    assert looks == [], "no look at every run before the earliest deadline it knows of"
    short = handle(3_000, sent=clock.monotonic())
    object.__setattr__(short.claim, "execution_id", 2)
    runs.add(short)
    await clock.advance(2.8)  # 2.8 s after its claim was sent: past 3 s less 0.3 s
    assert fencing.fence_expired() == 1
    assert short.cancel_reason is CancelReason.FENCED and long.cancel_reason is None
    long.deadline += 60  # renewed
    await clock.advance(56)
    assert fencing.fence_expired() == 0 and long.cancel_reason is None
    await clock.advance(61)
    assert fencing.fence_expired() == 1 and long.cancel_reason is CancelReason.FENCED


async def test_a_slow_successful_renewal_extends_trust_only_from_when_it_was_sent(
    clock: ManualClock, shared: Collaborators, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = Runs()
    run = handle(3_000, sent=clock.monotonic())
    runs.add(run)

    async def slow_renewal(*_args: Any, **_kwargs: Any) -> None:
        await clock.advance(2.0)  # the answer comes back 2 s after the renewal was sent
        return None  # every lease renewed

    monkeypatch.setattr(slotcron.store.runs, "renew", slow_renewal)
    heartbeat = Heartbeat(shared, runs=runs, period=0.5, instance_state=lambda: "running")
    await clock.advance(1.0)
    sent = clock.monotonic()
    await heartbeat.beat()
    assert run.deadline == pytest.approx(sent + 3.0 - 0.3)  # not (answer + 3.0 - 0.3)


async def test_a_renewal_that_fails_leaves_the_deadline_where_it_was(
    clock: ManualClock, shared: Collaborators, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = Runs()
    run = handle(3_000, sent=clock.monotonic())
    runs.add(run)
    before = run.deadline

    async def refused(*_args: Any, **_kwargs: Any) -> None:
        raise ConnectionRefusedError("the database is gone")

    monkeypatch.setattr(slotcron.store.runs, "renew", refused)
    heartbeat = Heartbeat(shared, runs=runs, period=0.5, instance_state=lambda: "running")
    await clock.advance(1.0)
    await heartbeat.beat()
    assert run.deadline == before
    await clock.advance(2.0)
    assert Fencing(shared, runs=runs).fence_expired() == 1


async def test_a_run_the_database_no_longer_counts_as_ours_is_fenced_at_once(
    clock: ManualClock, shared: Collaborators, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = Runs()
    run = handle(60_000, sent=clock.monotonic())
    runs.add(run)

    async def lapsed(*_args: Any, **_kwargs: Any) -> set[int]:
        return set()  # its lease lapsed: the renewal did not revive it

    monkeypatch.setattr(slotcron.store.runs, "renew", lapsed)
    heartbeat = Heartbeat(shared, runs=runs, period=0.5, instance_state=lambda: "running")
    await heartbeat.beat()
    assert run.cancel_reason is CancelReason.FENCED and run.lease_lost.is_set()
