"""Structured logs: ``SCHEDULER_LOG_FORMAT=json`` writes one JSON object per line, and the lines
of a run's life carry its job, slot, execution id, instance and outcome. Both formats mask every
secret shape, and a text line cannot be forged by what an id or an error holds."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path

import pytest
from slotcron.observe.logs import JsonFormatter, TextFormatter, run_fields

from tests.cluster.harness import read_records, wait_until
from tests.conftest import Spawn
from tests.test_masking import SECRET, SHAPES

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


def record_of(
    message: str, *args: object, error: str | None = None, **extra: object
) -> logging.LogRecord:
    """A WARNING record; with ``error``, one logged while handling a RuntimeError of that text."""
    exc_info = None
    if error is not None:
        try:
            raise RuntimeError(error)
        except RuntimeError:
            exc_info = sys.exc_info()
    record = logging.LogRecord(
        "slotcron.http", logging.WARNING, __file__, 1, message, args or None, exc_info
    )
    record.__dict__.update(extra)
    return record


@pytest.mark.parametrize(("text", "kept"), SHAPES, ids=[kept for _, kept in SHAPES])
def test_every_secret_shape_is_masked_in_text_and_json_lines(text: str, kept: str) -> None:
    """In the message, in the traceback, and in every ``extra`` field."""
    record = record_of("job failed: %s", text, error=text, detail=text, nested={"error": text})
    for line in (TextFormatter().format(record), JsonFormatter().format(record)):
        assert SECRET not in line, line
    as_json = json.loads(JsonFormatter().format(record))
    assert kept in as_json["message"] and kept in as_json["exception"]
    assert kept in as_json["detail"] and kept in as_json["nested"]["error"]
    assert kept in TextFormatter().format(record)


def test_fields_named_like_secrets_are_hidden_whole_in_json_lines() -> None:
    record = record_of("connecting", password=SECRET, api_key=1234, fencing_token=17)
    as_json = json.loads(JsonFormatter().format(record))
    assert as_json["password"] == "***" and as_json["api_key"] == "***"
    assert as_json["fencing_token"] == 17  # a counter, not a secret


def test_an_id_with_a_newline_cannot_forge_a_text_log_line() -> None:
    """The admin API's audit line names the schedule it changed: an id holding a newline and a
    whole fake record stays one line, its controls escaped."""
    forged = "2026-01-02T03:04:05.000Z INFO    slotcron.http: admin API: remove schedule all"
    schedule_id = f"tenant/a\n{forged}\r\x1b[2K\x85"
    record = record_of("admin API: %s (from %s)", f"add schedule {schedule_id}", "10.0.0.9")
    text = TextFormatter().format(record)
    assert "\n" not in text and "\r" not in text and "\x1b" not in text and "\x85" not in text
    assert text.endswith(f"add schedule tenant/a\\x0a{forged}\\x0d\\x1b[2K\\x85 (from 10.0.0.9)")
    as_json = json.loads(JsonFormatter().format(record))
    assert schedule_id in as_json["message"]  # JSON escapes by itself, and gives it back


def test_a_traceback_in_a_text_line_is_indented_so_it_cannot_start_a_record() -> None:
    forged = "2026-01-02T03:04:05.000Z ERROR   slotcron.runner: something else entirely"
    text = TextFormatter().format(record_of("run failed", error=f"boom\n{forged}\x1b[31m"))
    first, *rest = text.split("\n")
    assert first.endswith("slotcron.http: run failed")
    assert rest[0] == "    Traceback (most recent call last):"
    assert all(line.startswith("    ") for line in rest), rest
    assert f"    {forged}\\x1b[31m" in rest


def test_json_lines_escape_del_and_stay_json() -> None:
    line = JsonFormatter().format(record_of("odd id %s", "a\x7fb\x9b", id="c\x7f"))
    assert "\x7f" not in line and "\x9b" not in line
    as_json = json.loads(line)
    assert as_json["message"] == "odd id a\x7fb\x9b" and as_json["id"] == "c\x7f"
