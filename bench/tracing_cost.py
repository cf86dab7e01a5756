"""What tracing costs per run: the six hooks a run passes through (claim, run start, job start,
outcome write, end), timed with tracing off (as without the ``otel`` extra: each hook tests a
module global) and on (the OpenTelemetry SDK, spans batched to an exporter that discards them,
as an OTLP exporter would send them off the hot path).

    python -m bench.tracing_cost [--runs 20000]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta

from slotcron.clock import Clock, ManualClock
from slotcron.jobs.registry import Job
from slotcron.observe import tracing
from slotcron.store.claims import Claim


async def _nothing() -> None:
    return None


def one_run(job: Job, claim: Claim, clock: Clock) -> None:
    tracing.claim_began()
    tracing.claimed(claim)
    tracing.run_began(job, claim, "bench-instance")
    tracing.job_started(clock)
    tracing.finishing()
    tracing.run_ended("COMPLETED", None)


def no_hooks(job: Job, claim: Claim, clock: Clock) -> None:
    return None


def measure(
    runs: int, hooks: Callable[[Job, Claim, Clock], None] = one_run, rounds: int = 7
) -> float:
    """Microseconds per run, the best of ``rounds`` (the machine may be shared: the best round
    is the one least disturbed)."""
    slot = datetime(2026, 1, 1, tzinfo=UTC)
    job = Job(name="bench.job", func=_nothing, kind="interval", expression="1")
    clock = ManualClock(slot + timedelta(milliseconds=3))
    claims = [Claim(i, job.name, slot, "interval", "RUNNING", 1, slot, 60_000) for i in range(runs)]
    results = []
    for _ in range(rounds):
        start = time.perf_counter()
        for claim in claims:
            hooks(job, claim, clock)
        results.append((time.perf_counter() - start) / runs * 1e6)
    return min(results)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20_000)
    args = parser.parse_args(argv)

    tracing.disable()
    base = measure(args.runs, no_hooks)  # the loop itself, and one call
    off = measure(args.runs) - base

    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class Discard(SpanExporter):
        def export(self, spans: object) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Discard(), max_queue_size=100_000))
    tracing.enable(provider)
    on = measure(args.runs) - base
    bare = provider.get_tracer("bench")
    start = time.perf_counter()
    for _ in range(args.runs):
        bare.start_span("bare").end()
    scale = (time.perf_counter() - start) / args.runs * 1e6
    provider.shutdown()
    tracing.disable()
    print(f"tracing off (or no otel extra): {off:.2f} us per run")
    print(f"tracing on (SDK, batched, 3 spans per run): {on:.2f} us per run")
    print(f"for scale, one bare SDK span (start, end): {scale:.2f} us")


if __name__ == "__main__":
    main()
