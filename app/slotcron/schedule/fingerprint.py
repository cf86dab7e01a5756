"""A schedule's fingerprint: where it places its slots on the UTC line, as one short string.

Two schedules are the same schedule when they place their slots at the same UTC instants,
whatever their text says: ``0 9 * * *`` in ``Europe/Paris`` read with two different tzdata
releases is two schedules if the zone's rules changed. The fingerprint is computed from
instants, never from strings: the next :data:`NEXT_SLOTS` slots after an anchor, and the first
slot after each of the :data:`HOURS` hours that follow it (a schedule faster than a second
still differs over a day). It carries its anchor, so that another instance can compute its own
schedule's fingerprint at the same instant and compare (:func:`same_schedule`).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Hashable
from datetime import UTC, datetime, timedelta
from typing import cast

from slotcron.schedule.slots import Schedule

NEXT_SLOTS = 20
HOURS = 24


def fingerprint(schedule: Schedule, anchor: datetime) -> str:
    """``<anchor as epoch microseconds>:<hash of the slot instants after it>``. Cached: jobs
    sharing a schedule, registered together, share one computation."""
    return _fingerprint(cast(Hashable, schedule), anchor.astimezone(UTC))


@functools.lru_cache(maxsize=4096)
def _fingerprint(hashable: Hashable, anchor: datetime) -> str:
    schedule = cast(Schedule, hashable)
    instants: list[datetime] = []
    slot = anchor
    for _ in range(NEXT_SLOTS):
        slot = schedule.next_after(slot)
        instants.append(slot)
    instants += [schedule.next_after(anchor + timedelta(hours=h)) for h in range(1, HOURS + 1)]
    text = ",".join(str(_micros(i)) for i in instants)
    return f"{_micros(anchor)}:{hashlib.sha256(text.encode()).hexdigest()[:40]}"


def anchor_of(fingerprint_text: str) -> datetime | None:
    """The anchor a fingerprint was computed at; None if it is not one of ours."""
    head, _, digest = fingerprint_text.partition(":")
    if not digest or not head.lstrip("-").isdigit():
        return None
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=int(head))


def same_schedule(schedule: Schedule, in_force: str | None) -> bool:
    """Whether ``schedule`` places its slots where the fingerprint ``in_force`` says (no
    fingerprint in force: nothing to differ from)."""
    if in_force is None:
        return True
    anchor = anchor_of(in_force)
    return anchor is not None and fingerprint(schedule, anchor) == in_force


def _micros(moment: datetime) -> int:
    delta = moment - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
