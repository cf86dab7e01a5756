"""Each job planned by one instance of the cluster: rendezvous hashing over the live members.

Every live instance that runs the same jobs (the same job digest: a blue/green deploy's two
colours are two groups) is a member. A job's owner is the member with the highest score of
hash(member, job) (rendezvous, or highest-random-weight, hashing): every member computes the
same owner from the same members without talking to the others; a member joining takes about
``1/n`` of the jobs from the others and moves no job between two others; a member leaving hands
only its own jobs on, spread over the rest.

Ownership decides who *tries*, never who runs: the claim in the database stays the only
arbiter. Two members with different views (one has not seen a join yet) both try the same
slot and one claim wins; a member whose owner it believes alive while it is dead tries
nothing, and the slot is taken over once it is overdue (:mod:`slotcron.engine.takeover`). A
stale view costs a few duplicate claim attempts or a fraction of a second, never a second run.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

from slotcron.jobs.registry import Job


def jobs_digest(jobs: Sequence[Job], tasks: Sequence[Job], default_timezone: str) -> str:
    """What an instance plans, as one value: the enabled jobs' names and schedules as they are
    in force here (the zone a job without one takes from the settings, its window) and the
    enabled tasks' names. Instances with the same digest share the planning of the same jobs
    (a blue/green deploy's two colours are two groups); instances that would plan a job
    differently never share it."""
    lines = sorted(
        [
            "\0".join(
                [
                    "job",
                    j.name,
                    j.kind,
                    j.expression,
                    j.timezone or default_timezone,
                    str(j.start_at),
                    str(j.end_at),
                ]
            )
            for j in jobs
            if j.enabled
        ]
        + [f"task\0{t.name}" for t in tasks if t.enabled]
    )
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:32]


def score(member: str, name: str) -> int:
    """The member's weight for the job: the same on every instance and every run."""
    digest = hashlib.blake2b(f"{member}\0{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def owner(name: str, members: Iterable[str]) -> str:
    """The member that plans ``name``: the highest score (ties by member id)."""
    return max(members, key=lambda member: (score(member, name), member))


class Shares:
    """This instance's view of its group's members, and which jobs are its own.

    A member alone (or not yet in its own view) owns every job: a single instance behaves as
    before, and an instance never waits for a membership read to fire.
    """

    def __init__(self, me: str) -> None:
        self.me = me
        self.members: tuple[str, ...] = (me,)
        self.changes = 0
        """How many times the members changed (a part holding ownership answers compares)."""
        self._owned: dict[str, bool] = {}

    @property
    def alone(self) -> bool:
        return len(self.members) < 2

    def update(self, members: Iterable[str]) -> bool:
        """Take the members read from the database (this instance among them whatever the
        read said: it is alive). True when they changed."""
        now = tuple(sorted({*members, self.me}))
        if now == self.members:
            return False
        self.members = now
        self._owned.clear()
        self.changes += 1
        return True

    def owns(self, name: str) -> bool:
        """Whether this instance plans ``name`` (a code job: remembered until the members
        change)."""
        if len(self.members) < 2:
            return True
        owned = self._owned.get(name)
        if owned is None:
            owned = self._owned[name] = owner(name, self.members) == self.me
        return owned

    def next_in_line(self, name: str) -> bool:
        """Whether this instance would own ``name`` if its owner left: the one member that
        takes over its overdue slots first (:mod:`slotcron.engine.takeover`), so that the
        others do not all claim the same rows at once."""
        if len(self.members) < 2:
            return True
        first = owner(name, self.members)
        if first == self.me:
            return True
        return owner(name, [m for m in self.members if m != first]) == self.me

    def owns_now(self, name: str) -> bool:
        """As :meth:`owns`, not remembered: for runtime schedules, of which an instance may see
        millions over its life."""
        return len(self.members) < 2 or owner(name, self.members) == self.me
