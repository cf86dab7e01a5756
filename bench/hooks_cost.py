"""What announcing a run costs: the events one run passes through (a claim begun and decided,
the run in flight, its body's start, its outcome's write, its end), through
:class:`slotcron.observe.events.Events`, timed

- with no listener at all (the announcing itself);
- with the built-ins an instance with HTTP has (metrics counted by Prometheus, traces off, the
  run log, no alert webhook): what every run costs in production;
- with the built-ins and one user hook (its two events queued and delivered by its task);
- for comparison, the built-ins called directly, as the engine did before the events (the
  metrics' and tracing's own calls, the outcome's log line).

    python -m bench.hooks_cost [--runs 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta

from slotcron.clock import ManualClock
from slotcron.jobs.registry import Job
from slotcron.observe import tracing
from slotcron.observe.alerts import NO_ALERTS
from slotcron.observe.events import Ending, Events, Hook, Observer, RunEvent
from slotcron.observe.metrics import Counting, PrometheusMetrics
from slotcron.observe.runlog import RunLog
from slotcron.store.claims import Claim

SLOT = datetime(2026, 1, 1, tzinfo=UTC)
CHUNK = 400
"""Runs announced before the hook's task delivers their events (two each: its queue holds 1000)."""
CLOCK = ManualClock(SLOT + timedelta(milliseconds=3))


async def _nothing() -> None:
    return None


JOB = Job(name="bench.job", func=_nothing, kind="interval", expression="1")


class Checkin(Hook):
    """A user hook that does almost nothing with what it hears."""

    def __init__(self) -> None:
        self.heard = 0

    async def run_started(self, run: RunEvent) -> None:
        self.heard += 1

    async def run_finished(self, run: RunEvent) -> None:
        self.heard += 1


def announced(events: Events) -> Callable[[Claim], None]:
    def one_run(claim: Claim) -> None:
        events.claim_began()
        events.claimed(claim)
        events.run_began(JOB, claim)
        began = events.run_started(claim)
        events.finishing()
        events.run_finished(
            claim,
            "COMPLETED",
            None,
            started_at=SLOT,
            duration=events.since(began),
            end=Ending.written(final=True, recorded=True),
        )

    return one_run


def direct(metrics: PrometheusMetrics) -> Callable[[Claim], None]:
    """The calls the engine made before the events (issue 27): the same figures, no events."""
    log = RunLog("bench-instance")

    def one_run(claim: Claim) -> None:
        tracing.claim_began()
        tracing.claimed(claim)
        tracing.run_began(JOB, claim, "bench-instance")
        began = metrics.run_started(JOB.name, claim.trigger, claim.scheduled_at)
        tracing.job_started(CLOCK)
        metrics.run_finished(JOB.name, "COMPLETED", began)
        tracing.finishing()
        log._completed_lines.take()  # the outcome writer's line (INFO, rate-limited)
        NO_ALERTS.failed  # the alert sender's look-up  # noqa: B018
        tracing.run_ended("COMPLETED", None)

    return one_run


async def measure(one_run: Callable[[Claim], None], runs: int, rounds: int = 7) -> float:
    """Microseconds per run, the best of ``rounds`` (the machine may be shared: the best round
    is the one least disturbed). Runs go in chunks that fit a hook's queue; each chunk ends
    once its queued events are delivered."""
    claims = [Claim(i, JOB.name, SLOT, "interval", "RUNNING", 1, SLOT, 60_000) for i in range(runs)]
    chunks = [claims[i : i + CHUNK] for i in range(0, runs, CHUNK)]
    results = []
    for _ in range(rounds):
        start = time.perf_counter()
        for chunk in chunks:
            for claim in chunk:
                one_run(claim)
            for queue in _QUEUES:
                await queue._queue.join()
        results.append((time.perf_counter() - start) / runs * 1e6)
    assert not any(queue.dropped for queue in _QUEUES)
    return min(results)


_QUEUES: list = []  # type: ignore[type-arg]


def builtins(metrics: PrometheusMetrics) -> Sequence[Observer]:
    return [Counting(metrics), tracing.Tracing(), RunLog("bench-instance")]


async def run(runs: int) -> dict[str, float]:
    tracing.disable()
    metrics = PrometheusMetrics(CLOCK)
    base = await measure(lambda claim: None, runs)  # the loop itself, and one call
    figures = {
        "no listener": await measure(announced(Events(clock=CLOCK)), runs) - base,
        "built-ins (metrics, traces off, run log)": await measure(
            announced(Events(builtins(metrics), clock=CLOCK)), runs
        )
        - base,
        "before the events: the same built-ins called directly": await measure(
            direct(metrics), runs
        )
        - base,
    }
    hook = Checkin()
    events = Events(builtins(metrics), [hook], clock=CLOCK)
    _QUEUES[:] = events.queues
    figures["built-ins and one user hook (queued, delivered)"] = (
        await measure(announced(events), runs) - base
    )
    await events.stop()
    _QUEUES.clear()
    return figures


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20_000)
    args = parser.parse_args(argv)
    for what, micros in asyncio.run(run(args.runs)).items():
        print(f"{what}: {micros:.2f} us per run")


if __name__ == "__main__":
    main()
