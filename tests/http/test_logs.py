"""Structured logs: ``SCHEDULER_LOG_FORMAT=json`` writes one JSON object per line, and the lines
of a run's life carry its job, slot, execution id, instance and outcome."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path

import pytest

from app.logs import JsonFormatter, TextFormatter, run_fields
from tests.cluster.harness import read_records, wait_until
from tests.conftest import Spawn

RUN_KEYS = {"job", "slot", "execution_id", "instance", "outcome"}


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_json_logs_are_one_object_per_line_and_run_lines_carry_the_run_fields(
    spawn: Spawn, records_path: Path
) -> None:
    proc = spawn(
        "jsonlog", "tests.http.jobs_http", SCHEDULER_LOG_FORMAT="json", SCHEDULER_LOG_LEVEL="DEBUG"
    )

    def ran_enough() -> bool:
        events = [r["event"] for r in read_records(records_path)]
        return events.count("end") >= 2 and events.count("fail") >= 2

    await asyncio.to_thread(wait_until, ran_enough, 20, "two runs of each job")
    proc.signal(signal.SIGTERM)
    assert await asyncio.to_thread(proc.wait, 20) == 0, proc.log()

    lines = [line for line in proc.full_log().splitlines() if line.strip()]
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except ValueError:
            raise AssertionError(f"not one JSON object: {line!r}") from None
    assert all({"ts", "level", "logger", "message"} <= set(r) for r in records)

    lifecycle = [r for r in records if "outcome" in r]
    by_execution: dict[int, set[str]] = defaultdict(set)
    for r in lifecycle:
        assert set(r) >= RUN_KEYS, r
        assert r["instance"] == "jsonlog"
        assert r["job"] in ("http.ok", "http.broken")
        assert datetime.fromisoformat(r["slot"].replace("Z", "+00:00")).tzinfo is not None
        by_execution[r["execution_id"]].add(r["outcome"])
    outcomes = set().union(*by_execution.values())
    assert {"RUNNING", "COMPLETED", "FAILED"} <= outcomes, outcomes
    # One completed run seen from claim to finish: claimed, started (RUNNING), COMPLETED.
    assert any({"RUNNING", "COMPLETED"} <= seen for seen in by_execution.values())
    failed = [r for r in lifecycle if r["outcome"] == "FAILED"]
    assert failed[0]["level"] == "WARNING" and "broken on purpose" in failed[0]["message"]


def test_the_text_format_stays_one_readable_sentence_per_line() -> None:
    slot = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    record = logging.LogRecord(
        "slotcron.runner", logging.INFO, __file__, 1, "%s slot %s %s", ("j", slot, "OK"), None
    )
    record.__dict__.update(run_fields("j", slot, 7, "i-1", "COMPLETED"))
    text = TextFormatter().format(record)
    assert text.endswith("INFO    slotcron.runner: j slot 2026-01-02 03:04:05+00:00 OK")
    as_json = json.loads(JsonFormatter().format(record))
    assert as_json["slot"] == "2026-01-02T03:04:05Z" and as_json["execution_id"] == 7
