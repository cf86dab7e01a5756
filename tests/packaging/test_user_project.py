"""slotcron beside a project of the shape that broke it (issue 27): a FastAPI-style project with
its own ``app`` and ``migrations`` packages, slotcron installed from the wheel (not this
checkout's editable install), on PostgreSQL. ``check``, ``migrate`` and ``run`` work, the job
fires (judged by the history the database records), SIGTERM ends the run with status 0, and the
project's own packages are still what ``app`` and ``migrations`` import, untouched."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import backends

COMMAND_TIMEOUT = 60
FIRE_WITHIN = 30.0
STOP_WITHIN = 45.0

USER_FILES = {
    "app/__init__.py": 'MARK = "the project\'s own app"\n',
    "app/jobs.py": """\
        from slotcron import JobContext, every


        @every(seconds=1, name="user-tick")
        async def tick(ctx: JobContext) -> None:
            ctx.logger.info("tick %s", ctx.scheduled_at.isoformat())
        """,
    "migrations/__init__.py": 'MARK = "the project\'s own migrations"\n',
    "migrations/env.py": 'raise RuntimeError("the project\'s own Alembic env ran")\n',
}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    for name, text in USER_FILES.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


@pytest.fixture
def pg_url(tmp_path: Path) -> Iterator[str]:
    if not backends.AVAILABLE.ok.get("postgresql"):
        pytest.skip(f"postgresql unreachable: {backends.AVAILABLE.why.get('postgresql')}")
    url = backends.create_database("postgresql", tmp_path)
    yield url
    backends.drop_database("postgresql", url)


def fingerprint(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


class Project:
    """The console script of the installed wheel, run in the project's directory."""

    def __init__(self, root: Path, site: Path, url: str) -> None:
        self.root = root
        self.site = site
        self.script = site / "bin" / "slotcron"
        env = {k: v for k, v in os.environ.items() if not k.upper().startswith("SCHEDULER_")}
        # The wheel's directory first: it wins over the editable install's path entry.
        env["PYTHONPATH"] = os.pathsep.join([str(site), env.get("PYTHONPATH", "")]).rstrip(
            os.pathsep
        )
        env["SCHEDULER_DATABASE_URL"] = url
        self.env = env

    def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.script), *args],
            cwd=self.root,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT,
            check=False,
        )

    def ok(self, *args: str) -> str:
        done = self(*args)
        assert done.returncode == 0, f"slotcron {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def python(self, code: str) -> str:
        done = subprocess.run(
            [sys.executable, "-c", code],
            cwd=self.root,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()


def completed_ticks(project: Project) -> list[dict[str, object]]:
    records = json.loads(project.ok("history", "user-tick", "--json"))
    return [r for r in records if r["status"] == "COMPLETED"]


def test_a_project_with_its_own_app_and_migrations_runs_slotcron_from_the_wheel(
    project: Path, installed: Path, pg_url: str
) -> None:
    before = fingerprint(project)
    user = Project(project, installed, pg_url)
    assert user.script.is_file(), "the wheel installs the console script"
    where = user.python("import slotcron; print(slotcron.__file__)")
    assert Path(where).is_relative_to(installed), f"slotcron imported from {where}"

    checked = user.ok("check", "--jobs", "app.jobs")
    assert "configuration ok" in checked and "user-tick" in checked

    migrated = user.ok("migrate")
    assert "migrated from empty to revision" in migrated, migrated
    assert "already at revision" in user.ok("migrate")

    runner = subprocess.Popen(
        [str(user.script), "run", "--jobs", "app.jobs"],
        cwd=project,
        env=user.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + FIRE_WITHIN
        while not completed_ticks(user):
            assert runner.poll() is None, f"run exited early:\n{runner.communicate()[0]}"
            assert time.monotonic() < deadline, f"no COMPLETED user-tick within {FIRE_WITHIN} s"
            time.sleep(0.3)
        os.killpg(runner.pid, signal.SIGTERM)
        output, _ = runner.communicate(timeout=STOP_WITHIN)
        assert runner.returncode == 0, output
    finally:
        if runner.poll() is None:
            os.killpg(runner.pid, signal.SIGKILL)
            runner.communicate(timeout=10)

    imported = user.python(
        "import app, migrations, slotcron.migrations as ours; "
        "print(app.MARK, '|', migrations.MARK, '|', ours.__file__)"
    )
    own_app, own_migrations, ours = (part.strip() for part in imported.split("|"))
    assert own_app == "the project's own app"
    assert own_migrations == "the project's own migrations"
    assert Path(ours).is_relative_to(installed)
    assert fingerprint(project) == before
