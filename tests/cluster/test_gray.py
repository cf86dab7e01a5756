"""Gray failures (issue 11): a database path that hangs, a process paused, a job that blocks the
event loop, a wall clock that steps, a claim that commits late, a queued retry, fencing tokens.

Real ``slotcron run`` processes; judged by what the jobs record with the real clock
(jobs_gray.py), the scheduler's own tables only for what it claims (statuses, history). Each test
collects every broken requirement and fails with all of them, so one run shows them all.
"""

from __future__ import annotations

import asyncio
import glob
import itertools
import json
import os
import re
import signal
import subprocess
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from slotcron.engine.shares import owner
from slotcron.store.database import Database
from slotcron.store.tables import executions
from sqlalchemy import select

from tests.cluster.conftest import Spawn
from tests.cluster.harness import (
    Instance,
    Run,
    early_starts,
    execution_rows,
    leader_row,
    mono_to_real,
    overlaps,
    read_records,
    runs,
    slot_time,
    slots_run_twice,
    wait_until,
)
from tests.proxy import Proxy

JOBS = "tests.cluster.jobs_gray"
LEASE = 3.0
DRAIN, CANCEL = 5.0, 3.0
# Shutdown goes through its phases (drain, cancel) and exits; the rest is start-up slack.
SHUTDOWN = DRAIN + CANCEL + 7.0
TOGETHER = 0.5
"""The most two runs of one forbid job may execute together: what a pause leaves before the
paused process can notice it was fenced."""
OUTCOME_IN_FLIGHT = 1.0
"""How long before a freeze a body may end and its outcome's write still be frozen (in the
proxy, or queued behind another write of its instance): such a run is neither judged healthy
nor counted against the slot if it is retried."""
TICK = 0.012
"""A clock read from the database (or, for SQLite, from file times) may lag the real one by a
kernel tick: a start this much before its slot may still be on time (as in test_skew.py)."""
SERVERS = pytest.mark.parametrize("backend", ["postgresql", "mariadb"], indirect=True)
FORBID = ("long-", "paused", "blocker", "steady-", "queued", "token")
"""The jobs (by name prefix) with ``overlap="forbid"`` in jobs_gray.py."""

Figures = Callable[..., None]


@pytest.fixture
def figures(backend: str) -> Figures:
    """``figures(scenario, **values)`` appends one JSON line (the scenario, the backend and the
    values) to the file named by ``SLOTCRON_FIGURES``: the figures of the issue's closing note,
    computed by the helpers the assertions use. Nothing when the variable is unset."""

    def write(scenario: str, **values: Any) -> None:
        target = os.environ.get("SLOTCRON_FIGURES")
        if not target:
            return
        line = {"scenario": scenario, "backend": backend, **values}
        with open(target, "a", encoding="utf-8") as out:
            out.write(json.dumps(line) + "\n")

    return write


def together_seconds(found: list[Run], until_: float, **kwargs: Any) -> float:
    """The longest time two runs of one forbid job executed together (0.0: never)."""
    forbid = [r for r in found if r.job.startswith(FORBID)]
    return round(max(overlaps(forbid, until=until_, **kwargs).values(), default=0.0), 3)


def retry_waited(found: list[Run], retried: list[Run]) -> float | None:
    """The longest a retry waited after its previous attempt stopped (None: no retry)."""
    waits = []
    for run in retried:
        stops = [
            r.stop
            for r in found
            if (r.job, r.slot, r.attempt) == (run.job, run.slot, run.attempt - 1)
            and r.stop is not None
        ]
        if stops:
            waits.append(run.start - max(stops))
    return round(max(waits), 2) if waits else None


def abandoned_healthy(
    found: list[Run],
    rows: dict[int, Any],
    healthy: Callable[[Run], bool],
    cut_short_too: bool = False,
) -> int:
    """Runs ``healthy`` judges healthy (by default only those that ran to their end) that the
    scheduler recorded ABANDONED."""
    return sum(
        1
        for run in found
        if ((run.finished and run.stop is not None) or cut_short_too)
        and healthy(run)
        and (row := rows.get(run.id)) is not None
        and row.status == "ABANDONED"
    )


def worst_exit(exits: dict[str, tuple[int | None, float]]) -> int | None:
    """The exit status after SIGTERM to report: the first nonzero (None: one did not exit)."""
    codes = [rc for rc, _ in exits.values()]
    return next((rc for rc in codes if rc != 0), 0)


def env(scenario: str, **more: Any) -> dict[str, Any]:
    return {
        "SLOTCRON_GRAY": scenario,
        "SCHEDULER_LEASE_SECONDS": LEASE,
        "SCHEDULER_HEARTBEAT_SECONDS": 0.5,
        "SCHEDULER_POOL_SIZE": 3,
        "SCHEDULER_SHUTDOWN_DRAIN_TIMEOUT": DRAIN,
        "SCHEDULER_SHUTDOWN_CANCEL_TIMEOUT": CANCEL,
        **more,
    }


@pytest.fixture
async def proxy(db_url: str) -> AsyncIterator[Proxy]:
    """A freezable TCP proxy in front of the test's database (served by the test's loop: wait
    with ``asyncio.to_thread`` or ``asyncio.sleep``, never by blocking it)."""
    started = await Proxy.for_url(db_url).start()
    yield started
    await started.close()


async def until(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    return await asyncio.to_thread(wait_until, condition, timeout, what)


async def stop(*instances: Instance) -> dict[str, tuple[int | None, float]]:
    """SIGTERM each; each one's exit status (None: still running after SHUTDOWN s) and how long
    it took to exit."""
    sent = time.monotonic()
    for instance in instances:
        if instance.alive():
            instance.signal(signal.SIGTERM)
    exits: dict[str, tuple[int | None, float]] = {}
    for instance in instances:
        assert instance.process is not None
        try:
            rc = await asyncio.to_thread(instance.process.wait, SHUTDOWN)
        except subprocess.TimeoutExpired:
            exits[instance.name] = (None, time.monotonic() - sent)
            instance.kill()
        else:
            exits[instance.name] = (rc, time.monotonic() - sent)
    return exits


def in_flight(found: list[Run], instance: str, job_prefix: str, since: float) -> Run | None:
    """A run of ``instance`` (job named ``job_prefix``...) running for at least ``since`` s."""
    now = time.time()
    for run in found:
        if (
            run.instance == instance
            and run.job.startswith(job_prefix)
            and run.stop is None
            and run.start < now - since
        ):
            return run
    return None


def verdict(problems: list[str]) -> None:
    shown = problems[:12] + ([f"... and {len(problems) - 12} more"] if len(problems) > 12 else [])
    assert not problems, "\n".join(shown)


def too_long_together(found: list[Run], until_: float, **kwargs: Any) -> list[str]:
    return [
        f"{job}: two runs executed together for {seconds:.1f} s (at most {TOGETHER} s)"
        for job, seconds in overlaps(found, until=until_, **kwargs).items()
        if seconds > TOGETHER
    ]


def twice(found: list[Run]) -> list[str]:
    return [
        f"{job} slot {slot}: its body ran to its end {n} times"
        for (job, slot), n in slots_run_twice(found).items()
    ]


async def statuses(db: Database) -> dict[int, Any]:
    return {row.id: row for row in await execution_rows(db)}


# (a) ------------------------------------------------------------------------------------------


@SERVERS
@pytest.mark.parametrize("hang", [20, 45])
async def test_a_database_path_hanging_runs_no_slot_twice_and_shuts_down_cleanly(
    db: Database,
    db_url: str,
    spawn: Spawn,
    proxy: Proxy,
    records_path: Path,
    hang: int,
    figures: Figures,
) -> None:
    # hung starts first, so that it (reaching the database through the proxy, a little slower)
    # holds long runs when the path hangs, instead of losing every race to well.
    hung = spawn("hung", JOBS, **env("hang", SCHEDULER_DATABASE_URL=proxy.url(db_url)))

    def long_run_on_hung() -> Run | None:
        return in_flight(runs(read_records(records_path)), "hung", "long-", 0.0)

    await until(long_run_on_hung, 40, "a long run in flight on hung")
    well = spawn("well", JOBS, **env("hang"))

    def long_run_in_flight_on_hung() -> Run | None:
        found = runs(read_records(records_path))
        if not any(r.instance == "well" for r in found):
            return None
        return in_flight(found, "hung", "long-", 1.0)

    await until(long_run_in_flight_on_hung, 40, "both up, a long run in flight on hung")
    proxy.freeze()
    frozen_at = time.time()
    await asyncio.sleep(hang)  # the scenario: the database path hangs this long
    proxy.thaw()
    thawed_at = time.time()

    def hung_finished_a_run_after_the_thaw() -> bool:
        return any(
            r.instance == "hung" and r.start > thawed_at + 1
            for r in runs(read_records(records_path))
            if r.finished
        )

    async def hung_decides_slots_again() -> bool:
        # hung reaches the database through the proxy, so well may win every race for a run
        # (under load it does, for 30 s): what shows hung's loops survived is that it decides
        # slots again (a run, or a slot SKIPPED because well's run holds the lease)
        if hung_finished_a_run_after_the_thaw():
            return True
        return any(
            row.instance_id == "hung" and row.created_at.timestamp() > thawed_at + 1
            for row in await execution_rows(db)
        )

    problems = []
    deadline = time.monotonic() + 30
    while not await hung_decides_slots_again():
        if time.monotonic() > deadline:
            problems.append("after the thaw: hung decided no slot within 30 s")
            break
        await asyncio.sleep(0.2)
    stopped_at = time.time()
    exits = await stop(hung, well)

    found = runs(read_records(records_path))
    forbid = [r for r in found if r.job.startswith("long-")]
    allow = [r for r in found if r.job == "allow-retry"]
    problems += too_long_together(forbid, stopped_at)
    problems += [
        f"allow-retry slot {slot}: two runs of the slot executed together for {s:.1f} s"
        for (_, slot), s in overlaps(allow, key=lambda r: (r.job, r.slot), until=stopped_at).items()
        if s > TOGETHER
    ]
    # A body that ended while its own instance's database path was frozen could not record its
    # outcome, nor one that ended just before (its outcome's write still on its way through the
    # proxy, or queued behind another write): the cluster cannot tell it from a dead run, records
    # it ABANDONED and, with attempts left, retries it (guarantee 1 allows a retry of a slot not
    # recorded COMPLETED; ctx.fencing_token is how a job tells the two writers apart). Every
    # other slot, and every slot recorded COMPLETED: once.
    rows = await statuses(db)
    unrecordable = {
        (r.job, r.slot)
        for r in found
        if r.instance == "hung"
        and r.finished
        and r.stop is not None
        and frozen_at - OUTCOME_IN_FLIGHT <= r.stop <= thawed_at
        and (row := rows.get(r.id)) is not None
        and row.status != "COMPLETED"
    }
    judged = [r for r in found if (r.job, r.slot) not in unrecordable]
    doubled = twice(judged)
    problems += doubled
    for job, slot in slots_run_twice(judged):
        for r in found:
            if (r.job, r.slot) == (job, slot):
                row = rows.get(r.id)
                problems.append(
                    f"  {job} {slot}: execution {r.id} attempt {r.attempt} ({r.trigger}) on "
                    f"{r.instance}, {r.start - frozen_at:+.3f} s to "
                    + (f"{r.stop - frozen_at:+.3f} s" if r.stop is not None else "-")
                    + f" from the freeze (thaw {thawed_at - frozen_at:+.1f} s), "
                    f"{'ended' if r.finished else 'stopped'}, recorded "
                    f"{row.status if row is not None else '-'}"
                )
    retried = [r for r in found if (r.job, r.slot) in unrecordable and r.attempt > 1]
    for run in retried:
        if run.trigger != "retry":
            problems.append(f"{run.job} slot {run.slot} ran again, but not as its retry")
    abandoned = 0
    for run in found:
        # judged: runs that ended before the SIGTERM (a drain's last moments are not the point)
        healthy = run.finished and (
            (run.instance == "well" and run.stop is not None and run.stop < stopped_at)
            or (run.stop is not None and run.stop < frozen_at - OUTCOME_IN_FLIGHT)
            or (run.start > thawed_at + 1 and run.stop is not None and run.stop < stopped_at)
        )
        row = rows.get(run.id)
        if healthy and row is not None and row.status == "ABANDONED":
            abandoned += 1
            problems.append(
                f"{run.job} slot {run.slot} on {run.instance} (execution {run.id}) ran to its end "
                f"{run.start - thawed_at:+.1f} s from the thaw and is recorded ABANDONED"
            )
    if "Task exception was never retrieved" in hung.full_log():
        problems.append("hung: a task ended on an exception nobody handled (see its log)")
    for name, (rc, took) in exits.items():
        if rc != 0:
            problems.append(
                f"{name} exited {rc} after SIGTERM ({took:.1f} s; limit {SHUTDOWN:g} s)"
            )
    split = Counter(r.instance for r in found if r.start > thawed_at + 1)
    print(f"\nhang {hang} s: {len(found)} runs, after the thaw {dict(split)}, exits {exits}")
    figures(
        f"hang {hang} s",
        together_s=together_seconds(found, stopped_at),
        run_twice=len(doubled),
        healthy_abandoned=abandoned,
        early=len(early_starts(found, TICK)),
        exit=worst_exit(exits),
        retries=len(retried),
        retry_waited_s=retry_waited(found, retried),
    )
    verdict(problems)


# (b) ------------------------------------------------------------------------------------------


async def renewed(db: Database, execution_id: int, timeout: float = 5.0) -> None:
    """Return as soon as the execution's ``lease_until`` moves (a renewal just committed)."""

    async def lease_until() -> Any:
        async with db.read() as conn:
            result = await conn.execute(
                select(executions.c.lease_until).where(executions.c.id == execution_id)
            )
            return result.scalar_one()

    first = await lease_until()
    deadline = time.monotonic() + timeout
    while await lease_until() == first:
        if time.monotonic() > deadline:
            raise AssertionError(f"execution {execution_id}'s lease not renewed in {timeout} s")
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
async def test_b_process_paused_past_its_lease_is_fenced_and_overlaps_nothing(
    db: Database, spawn: Spawn, records_path: Path, figures: Figures
) -> None:
    p = spawn("p", JOBS, **env("pause"))
    q = spawn("q", JOBS, **env("pause"))

    def run_in_flight() -> Run | None:
        found = runs(read_records(records_path))
        return in_flight(found, "p", "paused", 1.0) or in_flight(found, "q", "paused", 1.0)

    # Whichever instance runs it is paused: one of two may win every race for a while.
    held: Run = await until(run_in_flight, 40, "a run of 'paused' in flight")
    name, other = (held.instance, "q" if held.instance == "p" else "p")
    target = p if name == "p" else q
    # The worst moment: just after a renewal, so that the lease lapses 0.3 s before the process
    # resumes (paused just before one, it lapses earlier and is judged ABANDONED by then).
    await renewed(db, held.id)
    target.signal(signal.SIGSTOP)
    paused_at = time.time()
    try:
        await asyncio.sleep(3.3)  # the scenario: a pause a little longer than the lease
    finally:
        target.signal(signal.SIGCONT)
    resumed_at = time.time()

    def played_out() -> bool:
        found = runs(read_records(records_path))
        mine = next((r for r in found if r.id == held.id and r.pid == held.pid), None)
        later = [r for r in found if r.start > held.start + 0.1]
        return mine is not None and mine.stop is not None and any(r.stop for r in later)

    await until(played_out, 40, "the paused run to end and the next one to end too")
    stopped_at = time.time()
    exits = await stop(p, q)

    found = runs(read_records(records_path))
    paused = {name: [(paused_at, resumed_at)]}
    problems = too_long_together(found, stopped_at, paused=paused)
    problems += twice(found)
    by_id = {r.id: r for r in found}
    rows = await statuses(db)
    figures(
        "pause",
        together_s=together_seconds(found, stopped_at, paused=paused),
        run_twice=len(slots_run_twice(found)),
        healthy_abandoned=abandoned_healthy(found, rows, lambda r: r.instance == other),
        early=len(early_starts(found, TICK)),
        exit=worst_exit(exits),
    )
    for row in rows.values():
        claim = re.search(r"execution (\d+) is still running", row.error or "")
        if row.status != "SKIPPED" or claim is None:
            continue
        at = row.created_at.timestamp()
        holder = by_id.get(int(claim.group(1)))
        running = (
            holder is not None and holder.start - 0.5 <= at <= (holder.stop or stopped_at) + 0.5
        )
        if running and holder is not None and holder.instance == name:
            # stopped past its lease: nothing runs, whatever the lease row says
            running = not (paused_at + LEASE + 0.5 < at < resumed_at)
        if not running:
            problems.append(
                f"slot {row.scheduled_at.isoformat()} recorded SKIPPED ({row.error}) at "
                f"{at - paused_at:+.1f} s from the pause, while that run was not running"
            )
    mine = by_id[held.id]
    if mine.finished or mine.lease_lost is not True:
        seen = "ran to its end" if mine.finished else f"stopped with lease_lost={mine.lease_lost}"
        problems.append(
            f"run {held.id} on {name}, paused {resumed_at - paused_at:.1f} s with a {LEASE:g} s "
            f"lease, {seen}: it was not fenced with ctx.lease_lost set"
        )
    verdict(problems)


# (c) ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
async def test_c_job_blocking_the_loop_keeps_its_lease_and_completes(
    db: Database, spawn: Spawn, records_path: Path, figures: Figures
) -> None:
    instances = [spawn(name, JOBS, **env("block")) for name in ("b1", "b2")]

    def three_finished() -> bool:
        return sum(r.finished for r in runs(read_records(records_path))) >= 3

    await until(three_finished, 45, "three runs of 'blocker' to finish")
    stopped_at = time.time()
    exits = await stop(*instances)

    found = runs(read_records(records_path))
    problems = too_long_together(found, stopped_at)
    problems += twice(found)
    rows = await statuses(db)
    figures(
        "blocked loop",
        together_s=together_seconds(found, stopped_at),
        run_twice=len(slots_run_twice(found)),
        healthy_abandoned=abandoned_healthy(
            found, rows, lambda r: (r.stop or stopped_at) < stopped_at
        ),
        early=len(early_starts(found, TICK)),
        exit=worst_exit(exits),
    )
    for run in found:
        row = rows.get(run.id)
        ended = run.finished and run.stop is not None and run.stop < stopped_at
        if ended and row is not None and row.status != "COMPLETED":
            problems.append(
                f"blocker slot {run.slot} on {run.instance} ran to its end and is recorded "
                f"{row.status}"
            )
    stall = re.compile(r"WARNING.*(blocker.*\d ?(s|ms|seconds)\b|\d ?(s|ms|seconds)\b.*blocker)")
    for instance in instances:
        ran = any(r.instance == instance.name and r.finished for r in found)
        if ran and not stall.search(instance.full_log()):
            problems.append(
                f"{instance.name}: no WARNING naming 'blocker' and how long it blocked the loop"
            )
    verdict(problems)


# (d) ------------------------------------------------------------------------------------------

SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* libfaketime 0.9.10 told not to fake CLOCK_MONOTONIC answers EINVAL to absolute monotonic
   sleeps (Python's time.sleep): those go straight to the kernel. */
int clock_nanosleep(clockid_t clock, int flags, const struct timespec *req, struct timespec *rem) {
    static int (*next)(clockid_t, int, const struct timespec *, struct timespec *);
    if (clock == CLOCK_MONOTONIC) {
        long r = syscall(SYS_clock_nanosleep, clock, flags, req, rem);
        return r == 0 ? 0 : errno;
    }
    if (!next) next = (int (*)(clockid_t, int, const struct timespec *, struct timespec *))
        dlsym(RTLD_NEXT, "clock_nanosleep");
    return next(clock, flags, req, rem);
}

/* Its pthread_cond_timedwait mangles the GIL's timed waits on CLOCK_MONOTONIC (they return at
   once, and a process with threads, aiosqlite's, thrashes): glibc's own, unfaked. */
int pthread_cond_timedwait(pthread_cond_t *cond, pthread_mutex_t *mutex,
                           const struct timespec *abstime) {
    static int (*real)(pthread_cond_t *, pthread_mutex_t *, const struct timespec *);
    void *libc;
    if (!real) {
        libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
        real = (int (*)(pthread_cond_t *, pthread_mutex_t *, const struct timespec *))
            dlvsym(libc, "pthread_cond_timedwait", "GLIBC_2.3.2");
    }
    return real(cond, mutex, abstime);
}
"""


@pytest.fixture(scope="session")
def faketime_preload(tmp_path_factory: pytest.TempPathFactory) -> str:
    """LD_PRELOAD for a process whose wall clock the test steps at run time: the shim (built
    once per session with gcc), then libfaketime. The shim comes first so that its
    clock_nanosleep is the one the process calls (libfaketime's answers EINVAL)."""
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketimeMT.so.1"))
    if not found:
        pytest.skip("libfaketime is not installed (apt-get install faketime)")
    built = tmp_path_factory.mktemp("faketime-shim")
    (built / "shim.c").write_text(SHIM)
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-O2", "-o", str(built / "shim.so"), str(built / "shim.c")],
        check=True,
    )
    return f"{built / 'shim.so'}:{found[0]}"


def stepped(preload: str, offset_file: Path) -> dict[str, Any]:
    offset_file.write_text("+0\n")
    return {
        "LD_PRELOAD": preload,
        "FAKETIME_TIMESTAMP_FILE": offset_file,
        "FAKETIME_NO_CACHE": 1,
        "FAKETIME_DONT_FAKE_MONOTONIC": 1,
    }


LOCAL = pytest.mark.parametrize("backend", ["sqlite", "postgresql"], indirect=True)


@LOCAL
async def test_d_wall_clock_stepping_ahead_starts_no_run_early(
    spawn: Spawn, records_path: Path, faketime_preload: str, tmp_path: Path, figures: Figures
) -> None:
    offset = tmp_path / "offset"
    stepper = spawn("stepper", JOBS, **env("step", **stepped(faketime_preload, offset)))
    real = mono_to_real()

    def slots_started(after: float) -> int:
        found = runs(read_records(records_path), real)
        return len({r.slot for r in found if r.start > after})

    await until(lambda: slots_started(0) >= 3, 40, "three slots run before the step")
    offset.write_text("+3\n")
    stepped_at = time.time()
    await until(lambda: slots_started(stepped_at) >= 8, 30, "eight slots run after the step")
    stopped_at = time.time()
    exits = await stop(stepper)

    found = runs(read_records(records_path), real)
    figures(
        "clock step",
        together_s=together_seconds(found, stopped_at),
        run_twice=len(slots_run_twice(found)),
        early=len(early_starts(found, TICK)),
        exit=worst_exit(exits),
    )
    problems = [
        f"{run.job} slot {run.slot} started {ahead:.3f} s before its time (real clock)"
        for run, ahead in early_starts(found, TICK)
    ]
    problems += twice(found)
    # The step is real: the process's own clock is 3 s ahead after it.
    records = [r for r in read_records(records_path) if r["event"] == "start"]
    ahead = [r["wall"] - real(r) for r in records if real(r) > stepped_at + 0.5]
    assert ahead and min(ahead) > 2.5, f"the wall clock did not step: {ahead[:5]}"
    verdict(problems)


@LOCAL
async def test_d_leader_stepping_ahead_abandons_no_healthy_run(
    db: Database,
    spawn: Spawn,
    records_path: Path,
    faketime_preload: str,
    tmp_path: Path,
    figures: Figures,
) -> None:
    offset = tmp_path / "offset"
    lead = spawn("lead", JOBS, **env("step", **stepped(faketime_preload, offset)))

    async def lead_leads() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if (await leader_row(db)).instance_id == "lead":
                    return
            except Exception:  # no row yet
                pass
            await asyncio.sleep(0.1)
        raise AssertionError("timed out after 30 s waiting for 'lead' to lead")

    await lead_leads()
    # Each steady job is planned by one of the two (rendezvous hashing): some by other.
    assert [owner(f"steady-{i}", ["lead", "other"]) for i in range(12)].count("other") == 3
    other = spawn("other", JOBS, **env("step"))
    real = mono_to_real()

    def steady_in_flight_on_other() -> Run | None:
        return in_flight(runs(read_records(records_path), real), "other", "steady-", 0.3)

    # Step while other holds a healthy run: the leader judges its lease by its own clock today.
    held: Run = await until(steady_in_flight_on_other, 30, "a steady run in flight on other")
    offset.write_text("+5\n")
    stepped_at = time.time()

    def played_out() -> bool:
        found = runs(read_records(records_path), real)
        mine = next((r for r in found if r.id == held.id), None)
        later = {r.slot for r in found if r.start > stepped_at}
        # watched for two leases: time for the leader to judge other's leases
        watched = time.time() > stepped_at + 2 * LEASE
        return watched and mine is not None and mine.stop is not None and len(later) >= 6

    await until(played_out, 30, "other's run to end, six slots and two leases after the step")
    stopped_at = time.time()
    exits = await stop(lead, other)

    found = runs(read_records(records_path), real)
    problems = twice(found)
    rows = await statuses(db)
    figures(
        "leader clock step",
        together_s=together_seconds(found, stopped_at),
        run_twice=len(slots_run_twice(found)),
        healthy_abandoned=abandoned_healthy(found, rows, lambda r: r.instance == "other", True),
        early=len(early_starts(found, TICK)),
        exit=worst_exit(exits),
    )
    for run in found:
        row = rows.get(run.id)
        # other is healthy throughout: none of its runs may be judged dead
        if run.instance == "other" and row is not None and row.status == "ABANDONED":
            ended = "ran to its end" if run.finished else "was cut short"
            problems.append(
                f"{run.job} slot {run.slot} on other ({run.start - stepped_at:+.1f} s from the "
                f"step), healthy, is recorded ABANDONED (its body {ended})"
            )
    verdict(problems)


# (e) ------------------------------------------------------------------------------------------

GRACE = {"late-cron": 2.0, "late-every": 3.0}
"""Each late job's grace (app/slotcron/jobs/misfire.py: until the next slot, between 1 s and 60
s)."""
START = 0.25
"""From a claim committed within the grace to the body's first line."""


@SERVERS
async def test_e_claim_committing_late_leaves_the_slot_to_the_misfire_policy(
    db_url: str, spawn: Spawn, proxy: Proxy, records_path: Path, figures: Figures
) -> None:
    late = spawn("late", JOBS, **env("late", SCHEDULER_DATABASE_URL=proxy.url(db_url)))

    def both_jobs_ran() -> bool:
        return {r.job for r in runs(read_records(records_path))} == set(GRACE)

    await until(both_jobs_ran, 40, "both jobs to run")
    # Freeze just before a late-cron slot, so its claim is in flight; thaw past every grace.
    now = time.time()
    due = (int(now) // 2 + 1) * 2
    await asyncio.sleep(max(0.0, due - 0.3 - now))
    proxy.freeze()
    frozen_at = time.time()
    await asyncio.sleep(7.0)  # the scenario: longer than either job's grace
    proxy.thaw()
    thawed_at = time.time()

    def resumed() -> bool:
        found = runs(read_records(records_path))
        return all(
            any(slot_time(r.slot) > thawed_at + 1 for r in found if r.job == j) for j in GRACE
        )

    await until(resumed, 30, "both jobs to fire on time again after the thaw")
    exits = await stop(late)

    found = runs(read_records(records_path))
    problems = []
    for run in found:
        lateness = run.start - slot_time(run.slot)
        if run.trigger in ("cron", "interval") and lateness > GRACE[run.job] + START:
            problems.append(
                f"{run.job} slot {run.slot} ({run.trigger}) started {lateness:.1f} s after its "
                f"time (grace {GRACE[run.job]:g} s; the freeze began "
                f"{frozen_at - slot_time(run.slot):+.1f} s from the slot): started as if on time"
            )
    problems += twice(found)
    figures(
        "late claim",
        started_late_as_on_time=len(problems) - len(slots_run_twice(found)),
        run_twice=len(slots_run_twice(found)),
        early=len(early_starts(found, TICK)),
        exit=worst_exit(exits),
    )
    verdict(problems)


# (f) ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
async def test_f_queued_retry_starts_soon_after_the_lease_it_waits_for_ends(
    db: Database, spawn: Spawn, records_path: Path, figures: Figures
) -> None:
    qa = spawn("qa", JOBS, **env("queued"))

    def holder() -> Run | None:
        found = runs(read_records(records_path))
        failed = next((r for r in found if r.attempt == 1 and r.stop and not r.finished), None)
        if failed is None:
            return None
        later = [r for r in found if r.attempt == 1 and r.start > failed.start]
        return later[0] if later and later[0].stop is not None else None

    held: Run = await until(holder, 60, "a failed run, then the next slot's run to end")
    assert held.stop is not None

    def retry() -> Run | None:
        return next((r for r in runs(read_records(records_path)) if r.attempt == 2), None)

    problems = []
    waited: float | None = None
    try:
        started: Run = await until(retry, 12, "the retry")
    except AssertionError:
        rows = [r for r in (await statuses(db)).values() if r.attempt == 2]
        problems.append(
            f"the retry (status {[r.status for r in rows]}) had not started 12 s after the run "
            f"holding the lease ended ({time.strftime('%H:%M:%S', time.gmtime(held.stop))} UTC)"
        )
    else:
        waited = started.start - held.stop
        if waited > 3.0:
            problems.append(f"the retry started {waited:.1f} s after the lease ended (at most 3 s)")
        print(f"\nretry started {waited:.2f} s after the lease ended")
    stopped_at = time.time()
    exits = await stop(qa)
    found = runs(read_records(records_path))
    figures(
        "queued retry",
        together_s=together_seconds(found, stopped_at),
        run_twice=len(slots_run_twice(found)),
        early=len(early_starts(found, TICK)),
        exit=worst_exit(exits),
        retry_waited_s=None if waited is None else round(waited, 2),
    )
    verdict(problems)


# (g) ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["sqlite", "postgresql", "mariadb"], indirect=True)
async def test_g_fencing_tokens_grow_with_every_run_across_the_cluster(
    spawn: Spawn, records_path: Path
) -> None:
    # One instance plans the job (rendezvous hashing: t1 of the two): t2 starts alone and runs
    # it, then t1 joins and takes it over; the tokens go on growing across the move.
    assert owner("token", ["t1", "t2"]) == "t1"
    t2 = spawn("t2", JOBS, **env("token"))
    await until(lambda: len(runs(read_records(records_path))) >= 5, 40, "5 runs on t2 alone")
    instances = [spawn("t1", JOBS, **env("token")), t2]

    def enough() -> bool:
        found = runs(read_records(records_path))
        return (
            len(found) >= 12
            and sum(r.attempt == 2 for r in found) >= 2
            and {r.instance for r in found} == {"t1", "t2"}
        )

    await until(enough, 40, "12 runs on both instances, two of them retries")
    await stop(*instances)

    found = runs(read_records(records_path))
    problems = [
        f"run {r.id} ({r.slot} attempt {r.attempt} on {r.instance}): ctx.fencing_token is "
        f"{r.token!r}, not an int"
        for r in found
        if not isinstance(r.token, int) or isinstance(r.token, bool)
    ]
    if not problems:
        for before, after in itertools.pairwise(found):
            if after.token <= before.token:
                problems.append(
                    f"token {after.token} (run {after.id} on {after.instance}) started after "
                    f"token {before.token} (run {before.id} on {before.instance})"
                )
    verdict(problems)
