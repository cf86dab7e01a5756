"""The operator commands (trigger, pause, resume, restart, jobs, instances) through the real
console script, against a real ``slotcron run`` on SQLite in a temp directory.

Jobs report what their ``ctx`` saw by checkpointing it, so ``history --json`` shows it.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.cli import Cli, one_line, poll, stop

JOBS = """
    from slotcron import JobContext, cron

    @cron("* * * * * *", name="tick")
    async def tick() -> None:
        pass

    @cron("0 0 1 1 *", name="on-demand")
    async def on_demand(ctx: JobContext) -> None:
        await ctx.checkpoint(saw_params=ctx.params, saw_trigger=ctx.trigger)

    @cron("0 0 1 1 *", name="bf-paused")
    async def bf_paused() -> None:
        pass

    @cron("0 0 1 1 *", name="resumable")
    async def resumable(ctx: JobContext) -> None:
        await ctx.checkpoint(started_with=dict(ctx.state), attempt_seen=ctx.attempt)
        if ctx.attempt == 1:
            await ctx.checkpoint(cursor=42)
            raise RuntimeError("disk full at row 42")
"""
JOB_FIELDS = {"name", "schedule", "timezone", "next_slot", "paused", "last_status"}
SERVICE_ENV = {
    "SCHEDULER_HEARTBEAT_SECONDS": "0.5",
    "SCHEDULER_SHUTDOWN_DRAIN_TIMEOUT": "3",
    "SCHEDULER_SHUTDOWN_CANCEL_TIMEOUT": "3",
}


def ops_cli(cwd: Path) -> Cli:
    """The console script bound to one directory and its SQLite database."""
    return Cli(cwd=cwd, url=f"sqlite+aiosqlite:///{cwd / 'ops.db'}", timeout=30)


def history(cli: Cli, job: str, *extra: str) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = cli.json("history", job, "--limit", "500", *extra)
    return records


def utc(text: str) -> datetime:
    assert text.endswith("Z"), f"{text!r} is not ISO-8601 UTC"
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def wait_until_live(cli: Cli, service: subprocess.Popen[str], log_path: Path) -> None:
    def live() -> bool | None:
        assert service.poll() is None, f"service exited early:\n{log_path.read_text()}"
        done = cli("instances", "--json")
        if done.returncode != 0:  # not migrated yet
            return None
        leaders = [i for i in json.loads(done.stdout) if i["leader"] and i["state"] == "running"]
        return True if leaders else None

    poll(live, timeout=20, what="the service to register and lead", interval=0.1)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cli]:
    """One ``slotcron run`` for the module (each test uses jobs of its own), SIGTERMed at the
    end with exit status 0."""
    cli = ops_cli(tmp_path_factory.mktemp("ops"))
    service, log_path = cli.start(cli.write_module("ops_jobs", JOBS), SERVICE_ENV)
    try:
        wait_until_live(cli, service, log_path)
        yield cli
        assert service.poll() is None, f"service died during the tests:\n{log_path.read_text()}"
    finally:
        stop(service, log_path)


# --- trigger ----------------------------------------------------------------------------------


def test_trigger_with_no_live_instance_refuses_in_one_line_and_exits_1(tmp_path: Path) -> None:
    cli = ops_cli(tmp_path)
    service, log_path = cli.start(cli.write_module("lonely", JOBS), SERVICE_ENV)
    try:
        wait_until_live(cli, service, log_path)
    finally:
        stop(service, log_path)  # the job stays known to the database; its instance is gone

    done = cli("trigger", "on-demand")

    assert done.returncode == 1, done
    line = one_line(done.stderr)
    assert "no live instance" in line
    assert "on-demand" in line
    assert not [r for r in history(cli, "on-demand") if r["trigger"] == "manual"]


def test_trigger_queues_a_manual_run_that_a_live_instance_starts_within_two_seconds(
    live: Cli,
) -> None:
    done = live.ok("trigger", "on-demand", "--param", "who=ops", "--param", "ticket=OPS-1")
    assert "queued execution" in done.stdout

    def completed() -> dict[str, Any] | None:
        runs = [r for r in history(live, "on-demand") if r["trigger"] == "manual"]
        return runs[0] if runs and runs[0]["status"] == "COMPLETED" else None

    run = poll(completed, timeout=6, what="the manual run to complete", interval=0.1)

    assert run["params"] == {"who": "ops", "ticket": "OPS-1"}
    assert run["state"] == {
        "saw_params": {"who": "ops", "ticket": "OPS-1"},
        "saw_trigger": "manual",
    }
    assert run["attempt"] == 1
    # For a manual run the slot is the moment it was requested.
    waited = (utc(run["started_at"]) - utc(run["scheduled_at"])).total_seconds()
    assert 0 <= waited < 2.5, f"the manual run started {waited:.2f} s after it was requested"


def test_trigger_of_a_job_the_database_does_not_know_is_bad_usage(live: Cli) -> None:
    done = live("trigger", "no-such-job")

    assert done.returncode == 2, done
    assert "no-such-job" in one_line(done.stderr)


# --- pause and resume -------------------------------------------------------------------------


def test_pause_records_the_next_slots_skipped_with_the_reason_and_resume_runs_them_again(
    live: Cli,
) -> None:
    assert "paused" in live.ok("pause", "tick", "--reason", "maintenance").stdout
    paused_at = datetime.now().astimezone()

    def skipped() -> list[dict[str, Any]] | None:
        found = history(live, "tick", "--status", "SKIPPED")
        after = [r for r in found if utc(r["scheduled_at"]) > paused_at]
        return after if len(after) >= 2 else None

    after_pause = poll(skipped, timeout=8, what="two SKIPPED slots after the pause", interval=0.1)
    assert {r["error"] for r in after_pause} == {"job is paused: maintenance"}
    assert "was already paused" in live.ok("pause", "tick").stdout
    [job] = [j for j in live.json("jobs") if j["name"] == "tick"]
    assert job["paused"] is True

    resuming_at = datetime.now().astimezone()  # slots before this were claimed while paused
    assert "resumed" in live.ok("resume", "tick").stdout
    resumed_at = datetime.now().astimezone()  # slots after this are claimed once resumed

    def running_again() -> dict[str, Any] | None:
        found = [
            r
            for r in history(live, "tick", "--status", "COMPLETED")
            if utc(r["scheduled_at"]) > resumed_at
        ]
        return found[0] if found else None

    poll(running_again, timeout=6, what="a COMPLETED slot after resume", interval=0.1)
    runs = history(live, "tick")
    between = [
        (r["scheduled_at"], r["status"])
        for r in runs
        if paused_at < utc(r["scheduled_at"]) < resuming_at
    ]
    assert between and {status for _, status in between} == {"SKIPPED"}, between
    after = [(r["scheduled_at"], r["status"]) for r in runs if utc(r["scheduled_at"]) > resumed_at]
    assert "SKIPPED" not in {status for _, status in after}, after


def test_pause_and_resume_of_an_unknown_job_are_bad_usage(live: Cli) -> None:
    for verb in ("pause", "resume"):
        done = live(verb, "no-such-job")
        assert done.returncode == 2, done
        assert "no-such-job" in one_line(done.stderr)


# --- skip and unskip ---------------------------------------------------------------------------

NEW_YEAR = "2031-01-01T00:00:00Z"  # a slot of on-demand ("0 0 1 1 *"), never reached here


def test_skip_and_unskip_of_a_future_slot_and_what_they_refuse(live: Cli) -> None:
    done = live.ok("skip", "on-demand", "--at", NEW_YEAR, "--reason", "holiday")
    assert "on-demand: slot 2031-01-01T00:00:00Z will be recorded SKIPPED" in done.stdout
    assert "already was" in live.ok("skip", "on-demand", "--at", NEW_YEAR).stdout
    bad = {
        ("on-demand", "2031-01-01T00:00:30Z"): "is not a slot of on-demand",
        ("on-demand", "new year"): "--at 'new year': expected an ISO-8601 time",
        ("no-such-job", NEW_YEAR): "no-such-job",
    }
    for (job, at), said in bad.items():
        refused = live("skip", job, "--at", at)
        assert refused.returncode == 2, refused
        assert said in one_line(refused.stderr), refused.stderr
    assert "no longer skipped" in live.ok("unskip", "on-demand", "--at", NEW_YEAR).stdout
    again = live("unskip", "on-demand", "--at", NEW_YEAR)
    assert again.returncode == 1 and "is not skipped" in one_line(again.stderr), again
    # A slot of tick is decided once a run of it, or of a later slot, is on record: the service
    # may have started a moment ago (the module's first test on this worker) and claimed nothing.
    past = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=10)

    def run_since() -> bool | None:
        return any(utc(r["scheduled_at"]) >= past for r in history(live, "tick")) or None

    poll(run_since, timeout=15, what=f"a run of tick at or after {past}", interval=0.2)
    decided = live("skip", "tick", "--at", past.isoformat())
    assert decided.returncode == 1 and "already decided" in one_line(decided.stderr), decided


def test_a_skipped_slot_of_a_running_job_is_recorded_skipped_with_the_reason(live: Cli) -> None:
    slot = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=4)
    live.ok("skip", "tick", "--at", slot.isoformat(), "--reason", "from the cli")

    def decided() -> list[dict[str, Any]] | None:
        found = [r for r in history(live, "tick") if utc(r["scheduled_at"]) == slot]
        return found or None

    [record] = poll(decided, timeout=15, what="the skipped slot decided", interval=0.2)
    assert (record["status"], record["error"]) == ("SKIPPED", "skipped: from the cli"), record
    assert record["started_at"] is None


# --- backfill ---------------------------------------------------------------------------------


def test_a_backfill_from_the_command_line_runs_the_years_before_the_job_once(live: Cli) -> None:
    span = ("--from", "2020-01-01T00:00:00Z", "--to", "2023-01-01T00:00:00Z")
    dry = live.ok("backfill", "on-demand", *span, "--dry-run")
    years = ["2020-01-01T00:00:00Z", "2021-01-01T00:00:00Z", "2022-01-01T00:00:00Z"]
    assert dry.stdout.split() == [*years, "3", "slots", "of", "on-demand", "would", "run"]
    made = live.json("backfill", "on-demand", *span, "--rate", "0")
    assert (made["slots"], made["status"], made["rate"]) == (3, "RUNNING", 0.0)

    def ran() -> list[dict[str, Any]] | None:
        runs = [r for r in history(live, "on-demand") if r["trigger"] == "backfill"]
        return runs if len(runs) == 3 and all(r["status"] == "COMPLETED" for r in runs) else None

    runs = poll(ran, timeout=20, what="three backfilled years", interval=0.2)
    assert sorted(r["scheduled_at"] for r in runs) == years
    assert {r["state"]["saw_trigger"] for r in runs} == {"backfill"}

    def completed() -> dict[str, Any] | None:
        listed = {b["id"]: b for b in live.json("backfill", "list")}[made["id"]]
        return listed if listed["status"] == "COMPLETED" else None

    listed = poll(completed, timeout=10, what="the backfill completed", interval=0.2)
    assert (listed["done"], listed["failed"], listed["left"]) == (3, 0, 0)
    assert f"{made['id']}" in live.ok("backfill", "list").stdout
    again = live.ok("backfill", "on-demand", *span, "--dry-run")
    assert again.stdout.split()[0] == "0", "a completed slot would run again"
    ended = live("backfill", "cancel", str(made["id"]))
    assert ended.returncode == 1 and "already COMPLETED" in one_line(ended.stderr), ended


def test_a_backfill_refuses_bad_input_and_a_paused_job(live: Cli) -> None:
    span = ("--from", "2020-01-01T00:00:00Z", "--to", "2021-06-01T00:00:00Z")
    bad = {
        ("on-demand", "--from", "2021-01-01T00:00:00Z", "--to", "2020-01-01T00:00:00Z"): (
            "is not after --from"
        ),
        ("on-demand", *span, "--rate", "-1"): "--rate must be between 0",
        ("on-demand", *span, "--rate", "fast"): "--rate must be a number",
        ("on-demand", "--from", "yesterday", "--to", "2021-01-01T00:00:00Z"): "--from 'yesterday'",
        ("on-demand",): "needs --from T1 and --to T2",
        ("no-such-job", *span): "no-such-job",
        ("tick", "--from", "2020-01-01T00:00:00Z", "--to", "2020-03-01T00:00:00Z"): (
            "more than 100000 slots"
        ),
        ("cancel",): "needs the backfill's ID",
        ("cancel", "999999"): "no backfill with id 999999",
        ("list", "--dry-run"): "takes no --from",
    }
    before = live.json("backfill", "list")
    for argv, said in bad.items():
        refused = live("backfill", *argv)
        assert refused.returncode == 2, (argv, refused)
        assert said in one_line(refused.stderr), (argv, refused.stderr)
    live.ok("pause", "bf-paused")
    paused = live("backfill", "bf-paused", *span)
    assert paused.returncode == 1 and "is paused" in one_line(paused.stderr), paused
    assert live.json("backfill", "list") == before, "a refused backfill wrote something"


# --- restart ----------------------------------------------------------------------------------


def test_restart_of_a_failed_execution_runs_its_slot_again_from_its_checkpoint(
    live: Cli,
) -> None:
    live.ok("trigger", "resumable")

    def failed() -> dict[str, Any] | None:
        runs = history(live, "resumable", "--status", "FAILED")
        return runs[0] if runs else None

    first = poll(failed, timeout=6, what="the first attempt to fail", interval=0.1)
    assert "disk full at row 42" in first["error"]
    assert first["state"]["cursor"] == 42

    done = live.ok("restart", str(first["id"]))
    assert "attempt 2" in done.stdout

    def second_attempt() -> dict[str, Any] | None:
        runs = [r for r in history(live, "resumable") if r["attempt"] == 2]
        return runs[0] if runs and runs[0]["status"] == "COMPLETED" else None

    second = poll(second_attempt, timeout=6, what="the restarted attempt to complete", interval=0.1)
    assert second["trigger"] == "restart"
    assert second["scheduled_at"] == first["scheduled_at"]
    assert second["state"]["started_with"] == first["state"]
    assert second["state"]["attempt_seen"] == 2

    # The slot is COMPLETED now: restarting it, by either execution, is refused.
    for execution in (second["id"], first["id"]):
        refused = live("restart", str(execution))
        assert refused.returncode == 1, refused
        assert "COMPLETED" in one_line(refused.stderr)
    assert len(history(live, "resumable")) == 2


def test_restart_of_an_execution_that_does_not_exist_is_bad_usage(live: Cli) -> None:
    done = live("restart", "987654")

    assert done.returncode == 2, done
    assert "987654" in one_line(done.stderr)


# --- jobs and instances -----------------------------------------------------------------------


def test_jobs_json_lists_every_registered_job_with_the_contract_fields(live: Cli) -> None:
    records = {r["name"]: r for r in live.json("jobs")}

    assert set(records) == {"tick", "on-demand", "bf-paused", "resumable"}
    for record in records.values():
        assert set(record) >= JOB_FIELDS, JOB_FIELDS - set(record)
        assert record["timezone"] == "UTC"
        assert isinstance(record["paused"], bool)
        assert record["next_slot"] is not None
        utc(record["next_slot"])
    assert "* * * * * *" in records["tick"]["schedule"]


def test_jobs_prints_a_table_with_a_header_row(live: Cli) -> None:
    lines = [line for line in live.ok("jobs").stdout.splitlines() if line.strip()]

    header = lines[0].split()
    assert header[:2] == ["JOB", "SCHEDULE"] and "PAUSED" in header
    names = {line.split()[0] for line in lines[1:]}
    assert names == {"tick", "on-demand", "bf-paused", "resumable"}


def test_instances_json_shows_the_live_instance_as_the_leader(live: Cli) -> None:
    [instance] = live.json("instances")

    assert instance["state"] == "running"
    assert instance["leader"] is True
    assert isinstance(instance["pid"], int)
    heartbeat_age = (datetime.now().astimezone() - utc(instance["heartbeat_at"])).total_seconds()
    assert heartbeat_age < 5, f"the live instance's heartbeat is {heartbeat_age:.1f} s old"
