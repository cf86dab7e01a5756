"""Traces: each run one OpenTelemetry span, when the ``slotcron[otel]`` extra is installed and the
standard ``OTEL_*`` variables ask for traces.

A run is the span ``slotcron.run <job>`` (a trace of its own), with the attributes
``slotcron.job``, ``slotcron.slot``, ``slotcron.attempt``, ``slotcron.trigger``,
``slotcron.instance``, ``slotcron.outcome`` and ``slotcron.lag`` (seconds from the slot to the
job's start, by the database clock). Its children: ``slotcron.claim`` (the claim transaction
that decided the slot, alone or in a batch with others) and
``slotcron.finish`` (the write of the outcome). The run's span is the current span while the
job runs, so the job's own spans nest under it.

**Off costs nothing, and imports nothing.** Tracing is on when ``OTEL_TRACES_EXPORTER`` (other
than ``none``) or an OTLP endpoint (``OTEL_EXPORTER_OTLP_ENDPOINT``,
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) is set and ``OTEL_SDK_DISABLED`` is not true, or when a
program calls :func:`enable`. Only then is ``opentelemetry`` imported; otherwise every hook
below is one test of a module global. These ``OTEL_*`` variables are the OpenTelemetry SDK's
own (it also reads ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER``
and the exporters' settings): slotcron reads them only to decide whether to start it.

The functions below are called by :class:`Tracing`, a built-in observer of the engine's
events (:mod:`slotcron.observe.events`): a claim's start and decision (:func:`claim_began`,
:func:`claimed`), a run in flight (:func:`run_began`), its body's start (:func:`job_started`),
its outcome's write (:func:`finishing`) and its end (:func:`run_ended`). A run's state travels
in a context variable: every event of one run is announced from the task that runs it.

**No secret in a span.** The error text a span's status carries is masked first
(:func:`slotcron.masking.mask`): a URL's password, ``password=``, ``token=``, ``Bearer …`` never
reach
the collector.
"""

from __future__ import annotations

import contextvars
import logging
import os
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from slotcron.errors import ConfigError
from slotcron.masking import mask
from slotcron.observe.events import Ending, Observer, RunEvent

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer, TracerProvider

    from slotcron.clock import Clock
    from slotcron.jobs.registry import Job
    from slotcron.store.claims import Claim

log = logging.getLogger("slotcron.tracing")

TRACER_NAME = "slotcron"
CLAIMS_KEPT = 100_000
"""Claim timings waiting for their run to start; past it they are dropped (a run that never
started, say at shutdown, must not hold memory forever)."""

_tracer: Tracer | None = None
_claim_start: contextvars.ContextVar[int] = contextvars.ContextVar("slotcron_claim_start")
_current: contextvars.ContextVar[_Run | None] = contextvars.ContextVar("slotcron_run", default=None)
_claims: dict[int, tuple[int, int]] = {}  # execution id -> (claim start ns, end ns)


@dataclass
class _Run:
    span: Span
    token: Any  # opentelemetry.context's token, to detach
    slot: datetime
    finish: Span | None = None


def enabled() -> bool:
    return _tracer is not None


def wanted(environ: dict[str, str] | None = None) -> bool:
    """Whether the ``OTEL_*`` variables ask for traces."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return exporter != "none"
    return bool(
        env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def install() -> bool:
    """Start tracing if the ``OTEL_*`` variables ask for it (once per process); True if on.

    Uses the global tracer provider when one is set already (``opentelemetry-instrument``, or
    the program's own); else builds one from the SDK with the exporters that
    ``OTEL_TRACES_EXPORTER`` names (default ``otlp``), batched. Raises :class:`ConfigError`
    naming the variable when an exporter is not installed."""
    if _tracer is not None:
        return True
    if not wanted():
        return False
    try:
        from opentelemetry import trace
    except ImportError:
        log.warning(
            "OTEL_* variables ask for traces, but OpenTelemetry is not installed "
            "(pip install 'slotcron[otel]'): no traces"
        )
        return False
    provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider):  # nobody set one: ours
        provider = _sdk_provider()
        trace.set_tracer_provider(provider)
    enable(provider)
    return True


def _sdk_provider() -> TracerProvider:
    from importlib.metadata import entry_points

    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        raise ConfigError(
            "OTEL_TRACES_EXPORTER",
            "the OpenTelemetry SDK is not installed: pip install 'slotcron[otel]'",
        ) from None
    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME") or "slotcron"})
    provider = TracerProvider(resource=resource)  # reads OTEL_TRACES_SAMPLER itself
    names = os.environ.get("OTEL_TRACES_EXPORTER", "otlp")
    for name in [n.strip() for n in names.split(",") if n.strip()]:
        found = list(entry_points(group="opentelemetry_traces_exporter", name=name))
        if not found:
            hint = " (pip install opentelemetry-exporter-otlp)" if name.startswith("otlp") else ""
            raise ConfigError(
                "OTEL_TRACES_EXPORTER", f"no span exporter named {name!r} is installed{hint}"
            )
        provider.add_span_processor(BatchSpanProcessor(found[0].load()()))
    return provider


def enable(provider: Any | None = None) -> None:
    """Trace runs from now on, with ``provider`` (default: the global one). For programs that
    embed the service, and for tests (an in-memory exporter)."""
    from opentelemetry import trace

    from slotcron.version import __version__

    global _tracer
    source = provider if provider is not None else trace.get_tracer_provider()
    _tracer = source.get_tracer(TRACER_NAME, __version__)


def disable() -> None:
    global _tracer
    _tracer = None
    _claims.clear()


# --- hooks: the claimer ---------------------------------------------------------------------


def claim_began() -> None:
    """A claim (of one slot, or of a batch) starts in this task."""
    if _tracer is not None:
        _claim_start.set(time.time_ns())


def claimed(claim: Claim) -> None:
    """The claim begun in this task decided ``claim``; a run it starts gets its timing."""
    if _tracer is None or claim.status != "RUNNING":
        return
    if len(_claims) >= CLAIMS_KEPT:
        _claims.clear()
    end = time.time_ns()
    _claims[claim.execution_id] = (_claim_start.get(end), end)


# --- hooks: the runner ----------------------------------------------------------------------


def run_began(job: Job, claim: Claim, instance_id: str) -> None:
    """Open the run's span (from its claim, when this instance claimed it) and make it current
    in this task, so the job's own spans nest under it."""
    if _tracer is None:
        return
    from opentelemetry import context, trace

    timing = _claims.pop(claim.execution_id, None)
    span = _tracer.start_span(
        f"slotcron.run {job.name}",
        context=context.Context(),  # a trace of its own, whatever the caller's context
        start_time=timing[0] if timing else None,
        attributes={
            "slotcron.job": job.name,
            "slotcron.slot": _iso(claim.scheduled_at),
            "slotcron.attempt": claim.attempt,
            "slotcron.trigger": claim.trigger,
            "slotcron.instance": instance_id,
            "slotcron.execution_id": claim.execution_id,
        },
    )
    parent = trace.set_span_in_context(span)
    if timing is not None and span.is_recording():  # a run sampled out costs no children
        child = _tracer.start_span("slotcron.claim", context=parent, start_time=timing[0])
        child.end(end_time=timing[1])
    _current.set(_Run(span, context.attach(parent), claim.scheduled_at))


def job_started(clock: Clock) -> None:
    """The job's coroutine starts now (by the scheduler's clock)."""
    run = _current.get()
    if run is not None and run.span.is_recording():
        lag = (clock.now() - run.slot).total_seconds()
        run.span.set_attribute("slotcron.lag", max(lag, 0.0))


def _lag(seconds: float | None) -> None:
    run = _current.get()
    if run is not None and seconds is not None and run.span.is_recording():
        run.span.set_attribute("slotcron.lag", seconds)


def finishing() -> None:
    """The job returned; the write of its outcome starts."""
    run = _current.get()
    if run is not None and _tracer is not None and run.span.is_recording():
        from opentelemetry import trace

        run.finish = _tracer.start_span(
            "slotcron.finish", context=trace.set_span_in_context(run.span)
        )


def run_ended(outcome: str, error: str | None = None) -> None:
    """Close the run's span with its outcome (``FENCED`` when its record was no longer ours)."""
    run = _current.get()
    if run is None:
        return
    from opentelemetry import context
    from opentelemetry.trace import Status, StatusCode

    _current.set(None)
    if run.finish is not None:
        run.finish.end()
    run.span.set_attribute("slotcron.outcome", outcome)
    if outcome in ("FAILED", "FENCED"):
        run.span.set_status(Status(StatusCode.ERROR, status_description(error or outcome)))
    run.span.end()
    context.detach(run.token)


class Tracing(Observer):
    """Traces as a built-in observer: each method is one test of a module global while tracing
    is off."""

    def claim_began(self) -> None:
        if _tracer is not None:
            _claim_start.set(time.time_ns())

    def claimed(self, claim: Claim) -> None:
        if _tracer is not None:
            claimed(claim)

    def run_began(self, job: Job, claim: Claim, instance_id: str) -> None:
        if _tracer is not None:
            run_began(job, claim, instance_id)

    def finishing(self) -> None:
        if _tracer is not None:
            finishing()

    def run_not_started(self) -> None:
        run_ended("NOT STARTED")

    def run_finished(self, run: RunEvent, end: Ending) -> None:
        if end.abandoned is not None:
            return  # another instance's run: no span of this instance's
        # The body's start lag, set at its end: the start's announcement leaves the run's task
        # (Events.run_started), the end's is made in it.
        _lag(run.lag_seconds)
        if end.why is not None:
            run_ended("FENCED")
        else:
            run_ended("FENCED" if run.fenced else run.status, run.error)


def status_description(error: str) -> str:
    """What a failed run's span says in its status: the error's last line (a traceback's says
    what went wrong), masked before it is cut to 300 characters, so a cut cannot leave half a
    secret unrecognised."""
    last = mask(error).strip().splitlines()[-1:] or ["FAILED"]
    return last[0][:300]


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")
