"""slotcron through a PostgreSQL failover (issue 25): real ``slotcron run`` processes reach the
primary through a harness ``Switch`` (a failover's virtual IP) or a multi-host URL; the primary
crashes (``stop('immediate')``), its streaming standby is promoted, and the switch moves to it.

Judged by what the jobs record with the real clock (jobs_topology.py): with a synchronous
standby nothing changes (no slot twice, no forbid job held past one lease after promotion, the
history true); with an asynchronous one whose last two seconds of commits are lost, every run
whose claim the new primary lost and that still runs is fenced within seconds, logged and
alerted (a slot run twice cannot be prevented there: it is reported, not judged).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.harness import Run, slot_time
from tests.pgcluster import Pair, PgServer, Switch, free_port
from tests.topology.conftest import DATABASE
from tests.topology.fleet import (
    Fleet,
    Key,
    Row,
    compare,
    figures,
    get,
    history,
    idle_gaps,
    key_of,
    log_lines,
    metric,
    readyz,
    running,
    shown_key,
    started_twice,
    unaccounted,
    until,
)
from tests.topology.jobs_topology import (
    LONG_ALLOW,
    QUICK_ALLOW,
    QUICK_FORBID,
    SLOW_FORBID,
)
from tests.webhook import webhook

LEASE = 6.0
HEARTBEAT = 1.5
FORBID = [*SLOW_FORBID, QUICK_FORBID]
JOBS = [*FORBID, QUICK_ALLOW, *LONG_ALLOW]
LOST = "its claim was lost in a database failover"
MAY_LOSE = "a failover can lose"
FENCE_WITHIN = 5.0
"""A run whose claim the new primary lost is fenced this soon after the switch."""
RECONNECT_WITHIN = 5.0
"""An instance finds the promoted standby by itself (a multi-host URL) this soon."""
CHECK_SLACK = 1.0
"""After an instance logs that the database is reachable again, its check of the runs in
flight may take this long (a run ending by itself meanwhile was not missed)."""
AFTER = 10.0
"""How long the jobs run on the new primary before the instances are stopped."""


def env(**more: Any) -> dict[str, Any]:
    return {
        "SCHEDULER_LEASE_SECONDS": LEASE,
        "SCHEDULER_HEARTBEAT_SECONDS": HEARTBEAT,
        "SCHEDULER_POOL_SIZE": 5,
        **more,
    }


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    made = Fleet(tmp_path)
    yield made
    made.close()


def in_flight(found: list[Run], at: float, jobs: list[str] | None = None) -> list[Run]:
    """Runs started before ``at`` that had not ended or stopped by then."""
    return [
        r
        for r in found
        if r.start < at and (r.stop is None or r.stop > at) and (jobs is None or r.job in jobs)
    ]


def steady(fleet: Fleet, since: float, instances: int) -> bool:
    """Runs of every job, by at least two instances, some slow ones in flight now."""
    found = fleet.runs()
    now = time.time()
    return (
        now > since
        and {r.job for r in found} >= set(JOBS)
        and len({r.instance for r in found}) >= min(2, instances)
        and len(in_flight(found, now, SLOW_FORBID)) >= 2
    )


async def replication_probe(port: int) -> tuple[str, float | None]:
    """What ``/readyz`` says of replication, and the metric."""
    _, body = await readyz(port)
    _, text = await get(port, "/metrics")
    return str(body.get("replication", "")), metric(
        text, "slotcron_database_synchronous_replication"
    )


async def failover(primary: PgServer, standby: PgServer, switch: Switch | None) -> float:
    """Crash the primary, promote the standby, move the switch; when the standby was
    promoted (the switch moved right after)."""
    await asyncio.to_thread(primary.stop, "immediate")
    await asyncio.to_thread(standby.promote)
    promoted = time.time()
    if switch is not None:
        await asyncio.to_thread(switch.switch_to, standby.port)
    return promoted


def reconnected(fleet: Fleet, after: float) -> dict[str, float]:
    """Per instance, when it first logged the database reachable again after ``after``."""
    found = {}
    for instance in fleet.instances:
        times = [t for t, _ in log_lines(instance, "database reachable again") if t > after]
        if times:
            found[instance.name] = min(times)
    return found


async def test_a_sync_standby_failover_runs_no_slot_twice_holds_no_job_and_keeps_history_true(
    pg_pair_sync: Pair, fleet: Fleet
) -> None:
    primary, standby = pg_pair_sync
    http = free_port()
    with Switch(primary.port) as switch:
        url = switch.url(primary.url(DATABASE))
        instances = [
            fleet.start(f"sync-{i}", url, "failover", **env(**extra))
            for i, extra in enumerate([{"SCHEDULER_HTTP_PORT": http}, {}, {}])
        ]
        await until(lambda: all(running(i) for i in instances), 60, "three instances running")
        up = time.time()
        await until(lambda: steady(fleet, up + 6, 3), 40, "runs of every job, slow ones in flight")
        said, synchronous = await replication_probe(http)

        failed_at = time.time()
        promoted = await failover(primary, standby, switch)
        switched = time.time()

        def resumed() -> bool:
            after = fleet.starts_after(switched)
            return time.time() > switched + AFTER and {r.job for r in after} >= set(FORBID)

        await until(resumed, AFTER + 30, "every forbid job to run on the new primary")
        stopping = time.time()
        codes = await fleet.stop()
    rows = await asyncio.to_thread(history, standby)
    found = fleet.runs()

    problems: list[str] = []
    twice = started_twice(found)
    problems += [f"{shown_key(k)} started {n} times" for k, n in twice.items()]
    gaps = {job: idle_gaps(found, job, promoted, stopping - 1) for job in FORBID}
    longest = max(gaps.values())
    if longest > LEASE:
        problems.append(f"a forbid job went without a run after promotion: {gaps} (<= {LEASE})")
    disagree = compare(found, rows)
    problems += disagree.describe()
    silent = unaccounted(found, rows, JOBS, up, stopping - 2)
    problems += [f"neither run nor recorded: {x}" for x in silent]
    fenced = [r for r in found if r.lease_lost]
    flying = in_flight(found, failed_at)
    if MAY_LOSE in said or "synchronous" not in said or synchronous != 1:
        problems.append(f"/readyz replication {said!r}, metric {synchronous} (synchronous)")
    if any(code != 0 for code in codes.values()):
        problems.append(f"exit statuses after SIGTERM: {codes}")
    back = reconnected(fleet, failed_at)
    figures(
        "failover[sync]",
        runs=len(found),
        in_flight_at_failover=len(flying),
        slots_run_twice=len(twice),
        longest_forbid_gap_after_promotion_s=longest,
        gaps_s={k: round(v, 2) for k, v in gaps.items()},
        history_rows=len(rows),
        history_disagreements=disagree.total,
        slots_unaccounted=len(silent),
        fenced=len(fenced),
        switch_s=switched - failed_at,
        reconnected_after_switch_s={k: round(v - switched, 2) for k, v in back.items()},
        readyz_replication=said[:60],
        metric_synchronous=synchronous,
        exits=codes,
    )
    assert not problems, "\n".join(problems[:20])


def lost_claims(snapshot: list[Row], flying: list[Run]) -> list[Run]:
    """Runs in flight whose claim the new primary (``snapshot``: its rows before any instance
    reached it) does not hold as theirs: absent, another instance's, or no longer RUNNING."""
    held = {(row.key, row.attempt, row.instance) for row in snapshot if row.status == "RUNNING"}
    return [r for r in flying if (key_of(r.job, r.slot), r.attempt, r.instance) not in held]


def rows_by_key(rows: list[Row]) -> dict[Key, list[Row]]:
    found: dict[Key, list[Row]] = {}
    for row in rows:
        found.setdefault(row.key, []).append(row)
    return found


def shown_rows(rows: list[Row]) -> str:
    return ", ".join(f"{r.status}@{r.instance}" for r in rows) or "no row"


def alert_for(alerts: list[dict[str, Any]], run: Run) -> dict[str, Any] | None:
    for alert in alerts:
        slot = datetime.fromisoformat(str(alert["slot"]).replace("Z", "+00:00"))
        if alert["job"] == run.job and key_of(run.job, slot) == key_of(run.job, run.slot):
            return alert
    return None


async def test_a_lossy_async_failover_fences_and_announces_every_run_whose_claim_was_lost(
    pg_pair_async: Pair, fleet: Fleet
) -> None:
    primary, standby = pg_pair_async
    assert standby.link is not None
    http = free_port()
    async with webhook() as hook:
        with Switch(primary.port) as switch:
            url = switch.url(primary.url(DATABASE))
            instances = [
                fleet.start(
                    f"async-{i}", url, "failover", **env(SCHEDULER_ALERT_WEBHOOK_URL=hook.url, **x)
                )
                for i, x in enumerate([{"SCHEDULER_HTTP_PORT": http}, {}, {}])
            ]
            await until(lambda: all(running(i) for i in instances), 60, "three instances running")
            up = time.time()
            warned = {i.name: len(log_lines(i, MAY_LOSE)) for i in instances}
            await until(lambda: steady(fleet, up + 6, 3), 40, "runs of every job, some in flight")
            said, synchronous = await replication_probe(http)

            # The standby stops receiving: what is committed from now on is lost.
            await asyncio.to_thread(standby.link.cut)
            cut = time.time()

            def claimed_after_cut() -> bool:
                later = fleet.starts_after(cut, LONG_ALLOW)
                return time.time() > cut + 2 and len(later) >= 2

            await until(claimed_after_cut, 15, "two seconds of claims the standby never got")
            failed_at = time.time()
            await asyncio.to_thread(primary.stop, "immediate")
            await asyncio.to_thread(standby.promote)
            promoted = time.time()
            # What the new primary has, before any instance reaches it.
            snapshot = await asyncio.to_thread(history, standby)
            await asyncio.to_thread(switch.switch_to, standby.port)
            switched = time.time()

            flying = in_flight(fleet.runs(), switched)
            lost = lost_claims(snapshot, flying)

            def settled() -> bool:
                by_id = {(r.pid, r.id): r for r in fleet.runs()}
                done = all(by_id[(r.pid, r.id)].stop is not None for r in lost)
                fenced = [r for r in by_id.values() if r.lease_lost and r.start < switched]
                alerted = all(alert_for(hook.events("FENCED"), r) for r in fenced)
                return time.time() > switched + AFTER and done and alerted

            await until(settled, AFTER + 20, "the lost runs to stop and their alerts to arrive")
            stopping = time.time()
            codes = await fleet.stop()
        warned_after = {i.name: len(log_lines(i, MAY_LOSE)) for i in instances}
        alerts = hook.events("FENCED")
    found = fleet.runs()
    by_id = {(r.pid, r.id): r for r in found}
    back = reconnected(fleet, failed_at)

    problems: list[str] = []
    for name, n in warned.items():
        if n != 1:
            problems.append(f"{name} logged {n} start-up WARNING(s) '{MAY_LOSE}' (one)")
    if MAY_LOSE not in said or synchronous != 0:
        problems.append(f"/readyz replication {said!r}, metric {synchronous} (asynchronous)")
    if not lost:
        problems.append("no run in flight lost its claim: the scenario did not happen")

    delays: list[float] = []
    unfenced: list[str] = []
    for run in lost:
        now = by_id[(run.pid, run.id)]
        assert now.stop is not None
        if now.lease_lost:
            delays.append(now.stop - switched)
            if now.stop - switched > FENCE_WITHIN:
                problems.append(
                    f"{run.job} {run.slot} on {run.instance}: fenced {now.stop - switched:.2f} s "
                    f"after the switch (within {FENCE_WITHIN} s)"
                )
        elif now.stop > back.get(run.instance, switched + FENCE_WITHIN) + CHECK_SLACK:
            unfenced.append(f"{run.job} {run.slot} on {run.instance}")
            problems.append(
                f"{run.job} {run.slot} on {run.instance}: its claim was lost, yet it ran on "
                f"to {now.stop - switched:.2f} s after the switch, not fenced"
            )

    fenced = [r for r in found if r.lease_lost]
    fenced_lost = [r for r in fenced if (r.pid, r.id) in {(x.pid, x.id) for x in lost}]
    missing_alerts = []
    for run in fenced_lost:
        alert = alert_for(alerts, run)
        if alert is None or LOST not in str(alert.get("error")):
            missing_alerts.append(f"{run.job} {run.slot}: {alert}")
    problems += [f"no FENCED alert naming '{LOST}' for {x}" for x in missing_alerts]
    warnings = [line for i in instances for _, line in log_lines(i, LOST)]
    if fenced_lost and not warnings:
        problems.append(f"no instance logged a WARNING '{LOST}'")
    if any(code != 0 for code in codes.values()):
        problems.append(f"exit statuses after SIGTERM: {codes}")

    rows = await asyncio.to_thread(history, standby)
    before = rows_by_key(snapshot)
    after = rows_by_key(rows)
    # Where the new primary had no row for a fenced run, the instance records it STOPPED;
    # another instance may have decided the slot first (MISSED, alone or in a range: the lost
    # claim left its job's high-water mark behind), and then that row stands. No row at all
    # leaves a slot whose body started unaccounted for.
    recorded_stopped, taken_by_other = 0, 0
    for run in fenced_lost:
        key = key_of(run.job, run.slot)
        now_rows = after.get(key, [])
        if any(row.status == "STOPPED" and row.instance == run.instance for row in now_rows):
            recorded_stopped += 1
        elif now_rows or any(row.covers(run.job, slot_time(run.slot)) for row in rows):
            taken_by_other += 1
        else:
            problems.append(
                f"{run.job} {run.slot} on {run.instance}: fenced, the new primary had no row for "
                "it, and none was recorded (STOPPED) after"
            )
    # Not judged (asynchronous replication loses what the standby never had): where the
    # history disagrees with the records, and the runs whose end the new primary never heard of.
    disagree = compare(found, rows)
    for line in disagree.describe():
        print("    history:", line)
    # Likewise not judged: slots the history no longer accounts for (a SKIPPED or MISSED row
    # committed in the lost seconds is gone with them).
    silent = unaccounted(found, rows, JOBS, up, stopping - 2)
    for line in silent:
        print("    neither run nor recorded on the new primary:", line)
    twice = started_twice(found)
    figures(
        "failover[async]",
        runs=len(found),
        lost_window_s=failed_at - cut,
        in_flight_at_switch=len(flying),
        claims_lost_in_flight=len(lost),
        fenced=len(fenced),
        fenced_lost_claims=len(fenced_lost),
        fence_delay_after_switch_s=(
            {"min": round(min(delays), 2), "max": round(max(delays), 2)} if delays else None
        ),
        not_fenced=len(unfenced),
        slots_run_twice=len(twice),
        fenced_alerts=len(alerts),
        fenced_recorded_stopped=recorded_stopped,
        fenced_slot_decided_by_another=taken_by_other,
        history_disagreements=disagree.total,
        slots_unaccounted=len(silent),
        startup_warnings=warned,
        warnings_by_end=warned_after,
        lost_warnings=len(warnings),
        promote_s=promoted - failed_at,
        reconnected_after_switch_s={k: round(v - switched, 2) for k, v in back.items()},
        readyz_replication=said[:60],
        metric_synchronous=synchronous,
        exits=codes,
    )
    for alert in alerts:
        if not any(alert_for([alert], r) for r in fenced):
            print(f"    FENCED alert with no fenced run recorded: {alert}")
    for run in fenced_lost:
        key = key_of(run.job, run.slot)
        print(
            f"    fenced {run.job} {run.slot} on {run.instance}: new primary before: "
            f"{shown_rows(before.get(key, []))}; after: {shown_rows(after.get(key, []))}"
        )
    # How each instance fenced its runs (the heartbeat's renewal, or the reconnection check).
    for instance in instances:
        lines = log_lines(instance, "fenced") + log_lines(instance, "no longer ours")
        for _, line in sorted(set(lines)):
            print(f"    {instance.name}: {line[:240]}")
    for key, n in twice.items():
        runs_of = [r for r in found if key_of(r.job, r.slot) == key]
        print(
            f"    run {n} times: {shown_key(key)}: "
            + "; ".join(
                f"{r.instance} {r.start - switched:+.2f}..{(r.stop or 0) - switched:+.2f} "
                f"{'end' if r.finished else 'stop'} lease_lost={r.lease_lost}"
                for r in runs_of
            )
        )
    assert not problems, "\n".join(problems[:20])


async def test_a_multi_host_url_finds_the_promoted_standby_and_jobs_run_again_within_seconds(
    pg_pair_sync: Pair, fleet: Fleet
) -> None:
    primary, standby = pg_pair_sync
    urls = {
        # The standby first: a read-only host is passed over for the primary.
        "multi-sqla": (
            f"postgresql+asyncpg://postgres@/{DATABASE}?host=127.0.0.1:{standby.port}"
            f"&host=127.0.0.1:{primary.port}&target_session_attrs=read-write"
        ),
        "multi-libpq": (
            f"postgresql://postgres@127.0.0.1:{standby.port},127.0.0.1:{primary.port}"
            f"/{DATABASE}?target_session_attrs=read-write"
        ),
    }
    instances = [fleet.start(name, url, "failover", **env()) for name, url in urls.items()]
    await until(lambda: all(running(i) for i in instances), 60, "two instances running")
    up = time.time()
    await until(
        lambda: {r.instance for r in fleet.starts_after(up)} == set(urls),
        30,
        "both instances to run jobs",
    )
    query = "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND application_name = $2"
    on_primary = await asyncio.to_thread(primary.fetchval, query, DATABASE, "slotcron")
    on_standby = await asyncio.to_thread(standby.fetchval, query, DATABASE, "slotcron")

    failed_at = time.time()
    promoted = await failover(primary, standby, None)

    def resumed() -> bool:
        after = fleet.starts_after(promoted)
        return {r.instance for r in after} == set(urls) and time.time() > promoted + AFTER

    await until(resumed, AFTER + 30, "both instances to run jobs on the promoted standby")
    stopping = time.time()
    codes = await fleet.stop()
    found = fleet.runs()
    rows = await asyncio.to_thread(history, standby)
    silent = unaccounted(found, rows, JOBS, up, stopping - 2)
    first_after = {
        name: min(r.start for r in found if r.instance == name and r.start > promoted) - promoted
        for name in urls
    }
    twice = started_twice(found)
    gaps = {job: idle_gaps(found, job, promoted, promoted + AFTER) for job in FORBID}
    back = reconnected(fleet, failed_at)
    problems: list[str] = []
    for name in urls:
        if name not in back or back[name] - promoted > RECONNECT_WITHIN:
            seconds = back.get(name, float("nan")) - promoted
            problems.append(
                f"{name} did not log the database reachable again within {RECONNECT_WITHIN} s of "
                f"the promotion ({seconds:.2f} s)"
            )
    if on_primary < len(urls) or on_standby:
        problems.append(
            f"before the failover: {on_primary} slotcron session(s) on the primary, "
            f"{on_standby} on the standby (every one on the primary)"
        )
    longest = max(gaps.values())
    if longest > LEASE:
        problems.append(f"a forbid job went without a run after promotion: {gaps} (<= {LEASE})")
    problems += [f"{shown_key(k)} started {n} times" for k, n in twice.items()]
    problems += [f"neither run nor recorded: {x}" for x in silent]
    if any(code != 0 for code in codes.values()):
        problems.append(f"exit statuses after SIGTERM: {codes}")
    figures(
        "failover[multi-host]",
        runs=len(found),
        sessions_on_primary_before=on_primary,
        sessions_on_standby_before=on_standby,
        promote_s=promoted - failed_at,
        reconnected_after_promotion_s={k: round(v - promoted, 2) for k, v in back.items()},
        first_run_after_promotion_s=min(first_after.values()),
        first_run_per_instance_s={k: round(v, 2) for k, v in first_after.items()},
        longest_forbid_gap_after_promotion_s=longest,
        slots_run_twice=len(twice),
        slots_unaccounted=len(silent),
        exits=codes,
    )
    assert not problems, "\n".join(problems[:20])
