"""Rendezvous ownership (slotcron.engine.shares): every member computes the same owner, the
shares are even, and a change of members moves only what it must."""

from __future__ import annotations

from collections import Counter

from slotcron.engine.shares import Shares, owner

JOBS = [f"job-{i}" for i in range(3000)]


def test_every_member_computes_the_same_owner_whatever_the_order() -> None:
    members = ["a", "b", "c"]
    for name in JOBS[:200]:
        assert owner(name, members) == owner(name, reversed(members))
    views = [Shares(m) for m in members]
    for view in views:
        view.update(members)
    for name in JOBS:
        assert sum(view.owns(name) for view in views) == 1, name


def test_the_shares_are_even() -> None:
    counts = Counter(owner(name, ["a", "b", "c"]) for name in JOBS)
    assert set(counts) == {"a", "b", "c"}
    assert all(900 <= n <= 1100 for n in counts.values()), counts


def test_a_member_joining_takes_jobs_only_for_itself_and_leaving_hands_on_only_its_own() -> None:
    before = {name: owner(name, ["a", "b", "c"]) for name in JOBS}
    joined = {name: owner(name, ["a", "b", "c", "d"]) for name in JOBS}
    moved = [name for name in JOBS if before[name] != joined[name]]
    assert all(joined[name] == "d" for name in moved)
    assert 600 <= len(moved) <= 900  # about a quarter
    left = {name: owner(name, ["a", "c"]) for name in JOBS}
    assert all(left[name] == before[name] for name in JOBS if before[name] != "b")


def test_alone_an_instance_owns_everything_and_is_always_its_own_member() -> None:
    shares = Shares("a")
    assert shares.alone and all(shares.owns(name) for name in JOBS[:10])
    assert not shares.update([])  # a read that missed itself: still alone, nothing changed
    assert shares.update(["b"])
    assert shares.members == ("a", "b") and not shares.alone
    owned = [name for name in JOBS if shares.owns(name)]
    assert owned == [name for name in JOBS if shares.owns_now(name)]
    assert 0 < len(owned) < len(JOBS)
    assert shares.update(["a"]) and shares.alone and shares.changes == 2
    assert all(shares.owns(name) for name in JOBS)


def test_the_digest_says_what_an_instance_plans() -> None:
    from dataclasses import replace

    from slotcron.engine.shares import jobs_digest
    from slotcron.jobs.registry import Job

    async def body() -> None: ...

    job = Job(name="a", func=body, kind="cron", expression="* * * * *")
    task = Job(name="t", func=body, kind="task", expression="")
    same = jobs_digest([job], [task], "UTC")
    assert jobs_digest([job], [task], "UTC") == same
    assert jobs_digest([replace(job, timezone="UTC")], [task], "UTC") == same  # as in force
    assert jobs_digest([job, replace(job, name="b", enabled=False)], [task], "UTC") == same
    assert jobs_digest([job], [task], "Europe/Paris") != same
    assert jobs_digest([replace(job, expression="*/5 * * * *")], [task], "UTC") != same
    assert jobs_digest([job], [], "UTC") != same


def test_exactly_one_other_member_is_next_in_each_jobs_line() -> None:
    members = ["a", "b", "c", "d"]
    views = {m: Shares(m) for m in members}
    for view in views.values():
        view.update(members)
    for i in range(200):
        name = f"job-{i}"
        first = owner(name, members)
        second = owner(name, [m for m in members if m != first])
        # The owner, and the one that owns the job once its owner has left.
        assert {m for m, view in views.items() if view.next_in_line(name)} == {first, second}
    alone = Shares("a")
    assert alone.next_in_line("job-1")
