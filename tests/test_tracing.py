"""Traces: each run one span with its claim and outcome write as children and the job's own spans
under it (OpenTelemetry's in-memory exporter); without the extra, or without ``OTEL_*``
variables asking for traces, nothing of OpenTelemetry is imported (fresh interpreters)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from slotcron.jobs.registry import Registry, every
from slotcron.observe import tracing

from tests.conftest import CI, ServiceFactory, wait_for
from tests.test_masking import SECRET, SHAPES

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def exporter() -> Iterator[tuple[InMemorySpanExporter, TracerProvider]]:
    try:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    except ImportError:
        if CI:
            pytest.fail("CI=true and OpenTelemetry is missing (the dev extra installs it)")
        pytest.skip("OpenTelemetry not installed: pip install -e '.[dev]' (or 'slotcron[otel]')")
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracing.enable(provider)
    yield memory, provider
    tracing.disable()


def traced_jobs(provider: TracerProvider) -> Registry:
    registry = Registry()
    own = provider.get_tracer("the-job")

    @every(seconds=1, name="t.ok", registry=registry)
    async def ok() -> None:
        with own.start_as_current_span("job.own-work"):
            pass

    @every(seconds=1, name="t.broken", registry=registry)
    async def broken() -> None:
        raise RuntimeError("broken on purpose")

    return registry


def named(spans: list[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [span for span in spans if span.name == name]


def children(spans: list[ReadableSpan], parent: ReadableSpan) -> dict[str, ReadableSpan]:
    assert parent.context is not None
    return {
        span.name: span
        for span in spans
        if span.parent is not None and span.parent.span_id == parent.context.span_id
    }


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"], indirect=True)
async def test_each_run_is_one_span_with_its_claim_write_and_the_jobs_own_spans_under_it(
    start_service: ServiceFactory, exporter: tuple[InMemorySpanExporter, TracerProvider]
) -> None:
    from opentelemetry.trace import StatusCode

    memory, provider = exporter
    service = await start_service(list(traced_jobs(provider)), instance_id="traced")

    def finished() -> list[ReadableSpan] | None:
        spans = list(memory.get_finished_spans())
        ok, broken = named(spans, "slotcron.run t.ok"), named(spans, "slotcron.run t.broken")
        return spans if len(ok) >= 2 and len(broken) >= 2 else None

    spans: list[ReadableSpan] = await wait_for(finished, timeout=15, what="two runs of each job")
    for run in named(spans, "slotcron.run t.ok"):
        attributes = dict(run.attributes or {})
        assert attributes["slotcron.job"] == "t.ok"
        assert attributes["slotcron.outcome"] == "COMPLETED"
        assert attributes["slotcron.attempt"] == 1
        assert attributes["slotcron.trigger"] == "interval"
        assert attributes["slotcron.instance"] == service.instance_id
        assert str(attributes["slotcron.slot"]).endswith("Z")
        assert 0 <= float(attributes["slotcron.lag"]) < 5  # type: ignore[arg-type]
        assert run.parent is None, "a run is a trace of its own"
        under = children(spans, run)
        assert set(under) == {"slotcron.claim", "slotcron.finish", "job.own-work"}
        assert run.start_time == under["slotcron.claim"].start_time  # from its claim on
        assert under["slotcron.claim"].end_time <= under["job.own-work"].start_time  # type: ignore[operator]
        assert under["job.own-work"].end_time <= under["slotcron.finish"].start_time  # type: ignore[operator]
        assert under["slotcron.finish"].end_time <= run.end_time  # type: ignore[operator]
    for run in named(spans, "slotcron.run t.broken"):
        assert dict(run.attributes or {})["slotcron.outcome"] == "FAILED"
        assert run.status.status_code is StatusCode.ERROR
        assert "RuntimeError: broken on purpose" in (run.status.description or "")
    # Distinct runs are distinct traces.
    runs = [span for span in spans if span.name.startswith("slotcron.run")]
    assert len({run.context.trace_id for run in runs if run.context is not None}) == len(runs)


LEAKY_ERROR = (
    f"could not reach postgresql://app:{SECRET}@db/x (password={SECRET}, "
    f"headers {{'Authorization': 'Bearer {SECRET}'}}, api_key={SECRET})"
)


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_a_failed_runs_span_status_carries_its_error_with_every_secret_masked(
    start_service: ServiceFactory, exporter: tuple[InMemorySpanExporter, TracerProvider]
) -> None:
    memory, _ = exporter
    registry = Registry()

    @every(seconds=1, name="t.leaky", registry=registry)
    async def leaky() -> None:
        raise RuntimeError(LEAKY_ERROR)

    await start_service(list(registry))

    def failed() -> list[ReadableSpan]:
        return named(list(memory.get_finished_spans()), "slotcron.run t.leaky")

    runs: list[ReadableSpan] = await wait_for(failed, timeout=15, what="a failed run's span")
    description = runs[0].status.description or ""
    assert SECRET not in description, description
    assert "postgresql://app:***@db/x" in description and "password=***" in description
    assert "'Bearer ***'" in description and "api_key=***" in description
    for span in memory.get_finished_spans():  # nor in any attribute of any span
        assert SECRET not in repr(dict(span.attributes or {}))


@pytest.mark.parametrize(("text", "kept"), SHAPES, ids=[kept for _, kept in SHAPES])
def test_a_span_status_masks_every_secret_shape(text: str, kept: str) -> None:
    error = f"Traceback (most recent call last):\n  ...\nRuntimeError: {text}"
    description = tracing.status_description(error)
    assert SECRET not in description and kept in description


def test_a_span_status_is_masked_before_it_is_cut() -> None:
    """Cut first, a long error could lose a URL's "@" and, with it, what makes its password
    recognisable."""
    error = "x" * 270 + f" postgresql://app:{SECRET}@db/x"
    assert len(error[:300]) == 300 and "@" not in error[:300]
    description = tracing.status_description(error)
    assert len(description) <= 300 and "Hunter" not in description


_SERVICE_SCRIPT = textwrap.dedent(
    """
    import asyncio, sys
    {prelude}
    from slotcron.observe import tracing
    from slotcron.config import Settings
    from slotcron.jobs.registry import Registry, every
    from slotcron.service.service import Service

    registry = Registry()
    ran = []

    @every(seconds=1, name="fresh.job", registry=registry)
    async def job() -> None:
        ran.append(1)

    async def main() -> None:
        settings = Settings(database_url="sqlite+aiosqlite:///{db}", heartbeat_seconds=1,
                            lease_seconds=10, auto_migrate=True)
        service = Service(settings, list(registry))
        await service.start()
        for _ in range(200):
            if ran:
                break
            await asyncio.sleep(0.05)
        await service.stop()
        assert ran, "the job never ran"
        loaded = sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry")
        print("TRACING", tracing.enabled(), "LOADED", len(loaded))

    asyncio.run(main())
    """
)

_BLOCK_OTEL = textwrap.dedent(
    """
    import importlib.abc
    class NoOtel(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "opentelemetry":
                raise ImportError("not installed: " + name)
            return None
    sys.meta_path.insert(0, NoOtel())
    """
)


def fresh(tmp_path: Path, *, block: bool, **otel_env: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "SCHEDULER_"))}
    env.update(otel_env)
    env["PYTHONPATH"] = str(ROOT)
    script = _SERVICE_SCRIPT.format(prelude=_BLOCK_OTEL if block else "", db=tmp_path / "fresh.db")
    return subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,
    )


def test_without_the_extra_nothing_of_opentelemetry_is_imported(tmp_path: Path) -> None:
    result = fresh(tmp_path, block=True, OTEL_TRACES_EXPORTER="console")
    assert result.returncode == 0, result.stderr
    assert "TRACING False LOADED 0" in result.stdout
    assert "OpenTelemetry is not installed (pip install 'slotcron[otel]')" in result.stderr


def test_with_the_extra_but_no_otel_variables_nothing_is_imported(tmp_path: Path) -> None:
    result = fresh(tmp_path, block=False)
    assert result.returncode == 0, result.stderr
    assert "TRACING False LOADED 0" in result.stdout


def test_otel_traces_exporter_console_prints_each_run_span(tmp_path: Path) -> None:
    result = fresh(
        tmp_path, block=False, OTEL_TRACES_EXPORTER="console", OTEL_SERVICE_NAME="fresh-svc"
    )
    assert result.returncode == 0, result.stderr
    assert "TRACING True" in result.stdout
    assert '"name": "slotcron.run fresh.job"' in result.stdout  # flushed at exit
    assert '"service.name": "fresh-svc"' in result.stdout


def test_an_exporter_that_is_not_installed_stops_start_up_naming_the_variable(
    tmp_path: Path,
) -> None:
    result = fresh(tmp_path, block=False, OTEL_TRACES_EXPORTER="nosuchexporter")
    assert result.returncode != 0
    assert "OTEL_TRACES_EXPORTER" in result.stderr and "'nosuchexporter'" in result.stderr


def test_the_otel_switch_follows_the_standard_variables() -> None:
    wanted: Any = tracing.wanted
    assert not wanted({})
    assert wanted({"OTEL_TRACES_EXPORTER": "otlp"})
    assert not wanted({"OTEL_TRACES_EXPORTER": "none"})
    assert wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert not wanted({"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "true"})
