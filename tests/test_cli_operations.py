"""The operator commands (trigger, pause, resume, restart, jobs, instances) through the real
console script, against a real ``slotcron run`` on SQLite in a temp directory.

Jobs report what their ``ctx`` saw by checkpointing it, so ``history --json`` shows it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import pytest

T = TypeVar("T")

JOBS = """
    from slotcron import JobContext, cron

    @cron("* * * * * *", name="tick")
    async def tick() -> None:
        pass

    @cron("0 0 1 1 *", name="on-demand")
    async def on_demand(ctx: JobContext) -> None:
        await ctx.checkpoint(saw_params=ctx.params, saw_trigger=ctx.trigger)

    @cron("0 0 1 1 *", name="resumable")
    async def resumable(ctx: JobContext) -> None:
        await ctx.checkpoint(started_with=dict(ctx.state), attempt_seen=ctx.attempt)
        if ctx.attempt == 1:
            await ctx.checkpoint(cursor=42)
            raise RuntimeError("disk full at row 42")
"""
JOB_FIELDS = {"name", "schedule", "timezone", "next_slot", "paused", "last_status"}


@dataclass
class Cli:
    """The console script bound to one directory and its SQLite database."""

    cwd: Path

    @property
    def url(self) -> str:
        return f"sqlite+aiosqlite:///{self.cwd / 'ops.db'}"

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        environ = {k: v for k, v in os.environ.items() if not k.upper().startswith("SCHEDULER_")}
        environ["SCHEDULER_DATABASE_URL"] = self.url
        environ.update(extra or {})
        return environ

    def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["slotcron", *args],
            cwd=self.cwd,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )

    def ok(self, *args: str) -> subprocess.CompletedProcess[str]:
        done = self(*args)
        assert done.returncode == 0, (
            f"slotcron {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
        )
        return done

    def json(self, *args: str) -> list[dict[str, Any]]:
        records: list[dict[str, Any]] = json.loads(self.ok(*args, "--json").stdout)
        return records

    def history(self, job: str, *extra: str) -> list[dict[str, Any]]:
        return self.json("history", job, "--limit", "500", *extra)

    def start(self, module: str) -> tuple[subprocess.Popen[str], Path]:
        log_path = self.cwd / "service.log"
        env = self.env(
            {
                "SCHEDULER_HEARTBEAT_SECONDS": "0.5",
                "SCHEDULER_SHUTDOWN_DRAIN_TIMEOUT": "3",
                "SCHEDULER_SHUTDOWN_CANCEL_TIMEOUT": "3",
            }
        )
        with log_path.open("w") as log:
            service = subprocess.Popen(
                ["slotcron", "run", "--jobs", module],
                cwd=self.cwd,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                text=True,
            )
        return service, log_path


def poll(probe: Callable[[], T | None], *, timeout: float, what: str) -> T:
    """Call ``probe`` until it returns something other than None; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


def utc(text: str) -> datetime:
    assert text.endswith("Z"), f"{text!r} is not ISO-8601 UTC"
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{stderr}"
    return lines[0]


def stop(service: subprocess.Popen[str], log_path: Path) -> None:
    """SIGTERM, and the clean exit the contract promises."""
    try:
        service.send_signal(signal.SIGTERM)
        code = service.wait(timeout=15)
        assert code == 0, f"service exited {code} on SIGTERM:\n{log_path.read_text()}"
    finally:
        if service.poll() is None:
            service.kill()
            service.wait(timeout=10)


def wait_until_live(cli: Cli, service: subprocess.Popen[str], log_path: Path) -> None:
    def live() -> bool | None:
        assert service.poll() is None, f"service exited early:\n{log_path.read_text()}"
        done = cli("instances", "--json")
        if done.returncode != 0:  # not migrated yet
            return None
        leaders = [i for i in json.loads(done.stdout) if i["leader"] and i["state"] == "running"]
        return True if leaders else None

    poll(live, timeout=20, what="the service to register and lead")


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cli]:
    """One ``slotcron run`` for the module (each test uses jobs of its own), SIGTERMed at the
    end with exit status 0."""
    cli = Cli(cwd=tmp_path_factory.mktemp("ops"))
    (cli.cwd / "ops_jobs.py").write_text(textwrap.dedent(JOBS), encoding="utf-8")
    service, log_path = cli.start("ops_jobs")
    try:
        wait_until_live(cli, service, log_path)
        yield cli
        assert service.poll() is None, f"service died during the tests:\n{log_path.read_text()}"
    finally:
        stop(service, log_path)


# --- trigger ----------------------------------------------------------------------------------


def test_trigger_with_no_live_instance_refuses_in_one_line_and_exits_1(tmp_path: Path) -> None:
    cli = Cli(cwd=tmp_path)
    (tmp_path / "lonely.py").write_text(textwrap.dedent(JOBS), encoding="utf-8")
    service, log_path = cli.start("lonely")
    try:
        wait_until_live(cli, service, log_path)
    finally:
        stop(service, log_path)  # the job stays known to the database; its instance is gone

    done = cli("trigger", "on-demand")

    assert done.returncode == 1, done
    line = one_line(done.stderr)
    assert "no live instance" in line
    assert "on-demand" in line
    assert not [r for r in cli.history("on-demand") if r["trigger"] == "manual"]


def test_trigger_queues_a_manual_run_that_a_live_instance_starts_within_two_seconds(
    live: Cli,
) -> None:
    done = live.ok("trigger", "on-demand", "--param", "who=ops", "--param", "ticket=OPS-1")
    assert "queued execution" in done.stdout

    def completed() -> dict[str, Any] | None:
        runs = [r for r in live.history("on-demand") if r["trigger"] == "manual"]
        return runs[0] if runs and runs[0]["status"] == "COMPLETED" else None

    run = poll(completed, timeout=6, what="the manual run to complete")

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
        found = live.history("tick", "--status", "SKIPPED")
        after = [r for r in found if utc(r["scheduled_at"]) > paused_at]
        return after if len(after) >= 2 else None

    after_pause = poll(skipped, timeout=8, what="two SKIPPED slots after the pause")
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
            for r in live.history("tick", "--status", "COMPLETED")
            if utc(r["scheduled_at"]) > resumed_at
        ]
        return found[0] if found else None

    poll(running_again, timeout=6, what="a COMPLETED slot after resume")
    history = live.history("tick")
    between = [
        (r["scheduled_at"], r["status"])
        for r in history
        if paused_at < utc(r["scheduled_at"]) < resuming_at
    ]
    assert between and {status for _, status in between} == {"SKIPPED"}, between
    after = [
        (r["scheduled_at"], r["status"]) for r in history if utc(r["scheduled_at"]) > resumed_at
    ]
    assert "SKIPPED" not in {status for _, status in after}, after


def test_pause_and_resume_of_an_unknown_job_are_bad_usage(live: Cli) -> None:
    for verb in ("pause", "resume"):
        done = live(verb, "no-such-job")
        assert done.returncode == 2, done
        assert "no-such-job" in one_line(done.stderr)


# --- restart ----------------------------------------------------------------------------------


def test_restart_of_a_failed_execution_runs_its_slot_again_from_its_checkpoint(
    live: Cli,
) -> None:
    live.ok("trigger", "resumable")

    def failed() -> dict[str, Any] | None:
        runs = live.history("resumable", "--status", "FAILED")
        return runs[0] if runs else None

    first = poll(failed, timeout=6, what="the first attempt to fail")
    assert "disk full at row 42" in first["error"]
    assert first["state"]["cursor"] == 42

    done = live.ok("restart", str(first["id"]))
    assert "attempt 2" in done.stdout

    def second_attempt() -> dict[str, Any] | None:
        runs = [r for r in live.history("resumable") if r["attempt"] == 2]
        return runs[0] if runs and runs[0]["status"] == "COMPLETED" else None

    second = poll(second_attempt, timeout=6, what="the restarted attempt to complete")
    assert second["trigger"] == "restart"
    assert second["scheduled_at"] == first["scheduled_at"]
    assert second["state"]["started_with"] == first["state"]
    assert second["state"]["attempt_seen"] == 2

    # The slot is COMPLETED now: restarting it, by either execution, is refused.
    for execution in (second["id"], first["id"]):
        refused = live("restart", str(execution))
        assert refused.returncode == 1, refused
        assert "COMPLETED" in one_line(refused.stderr)
    assert len(live.history("resumable")) == 2


def test_restart_of_an_execution_that_does_not_exist_is_bad_usage(live: Cli) -> None:
    done = live("restart", "987654")

    assert done.returncode == 2, done
    assert "987654" in one_line(done.stderr)


# --- jobs and instances -----------------------------------------------------------------------


def test_jobs_json_lists_every_registered_job_with_the_contract_fields(live: Cli) -> None:
    records = {r["name"]: r for r in live.json("jobs")}

    assert set(records) == {"tick", "on-demand", "resumable"}
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
    assert names == {"tick", "on-demand", "resumable"}


def test_instances_json_shows_the_live_instance_as_the_leader(live: Cli) -> None:
    [instance] = live.json("instances")

    assert instance["state"] == "running"
    assert instance["leader"] is True
    assert isinstance(instance["pid"], int)
    heartbeat_age = (datetime.now().astimezone() - utc(instance["heartbeat_at"])).total_seconds()
    assert heartbeat_age < 5, f"the live instance's heartbeat is {heartbeat_age:.1f} s old"
