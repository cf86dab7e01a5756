"""The one way the tests run the command line: the real console script in a subprocess, with
no ``SCHEDULER_*`` variable from the test's own environment but the database URL and what a
test adds. Used by every CLI test (tests/test_cli*.py, tests/integration/test_migrations.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
COMMAND = (sys.executable, "-m", "slotcron")
"""What ``slotcron`` runs (the same ``main``), without the shell shims an installation may put in
front of the console script (pyenv's cost 0.4 s a call); tests/test_cli.py runs the console
script itself."""


@dataclass
class Cli:
    """``slotcron [PREFIX...] ARGS`` in ``cwd`` against ``url``; a command not done within
    ``timeout`` seconds fails the test."""

    cwd: Path
    url: str
    prefix: tuple[str, ...] = ()
    extra_env: dict[str, str] = field(default_factory=dict)
    timeout: float = 60

    def env(self, overrides: dict[str, str] | None = None) -> dict[str, str]:
        environ = {k: v for k, v in os.environ.items() if not k.upper().startswith("SCHEDULER_")}
        environ["SCHEDULER_DATABASE_URL"] = self.url
        environ.update(self.extra_env)
        environ.update(overrides or {})
        return environ

    def __call__(
        self, *args: str, env: dict[str, str] | None = None, timeout: float | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*COMMAND, *self.prefix, *args],
            cwd=self.cwd,
            env=self.env(env),
            capture_output=True,
            text=True,
            timeout=self.timeout if timeout is None else timeout,
            check=False,
        )

    def run_bytes(self, args: list[str | bytes], env: dict[str, str]) -> tuple[int, str, str]:
        """Arguments that may not be valid UTF-8; output decoded with replacement."""
        argv = [a if isinstance(a, bytes) else a.encode() for a in args]
        done = subprocess.run(
            [*(c.encode() for c in COMMAND), *argv],
            cwd=self.cwd,
            env=self.env(env),
            capture_output=True,
            timeout=30,
            check=False,
        )
        out, err = (s.decode("utf-8", "replace") for s in (done.stdout, done.stderr))
        return done.returncode, out, err

    def ok(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        done = self(*args, env=env)
        assert done.returncode == 0, (
            f"slotcron {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
        )
        return done

    def text(self, *args: str) -> str:
        return self.ok(*args).stdout

    def json(self, *args: str) -> Any:
        return json.loads(self.ok(*args, "--json").stdout)

    def write_module(self, name: str, source: str) -> str:
        (self.cwd / f"{name}.py").write_text(textwrap.dedent(source), encoding="utf-8")
        return name

    def start(
        self, module: str, env: dict[str, str] | None = None, log_name: str = "service.log"
    ) -> tuple[subprocess.Popen[str], Path]:
        """``slotcron run --jobs MODULE`` in the background, its output in ``cwd/log_name``."""
        log_path = self.cwd / log_name
        with log_path.open("w") as log:
            service = subprocess.Popen(
                [*COMMAND, "run", "--jobs", module],
                cwd=self.cwd,
                env=self.env(env),
                stdout=log,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
        return service, log_path


def stop(service: subprocess.Popen[str], log_path: Path) -> None:
    """SIGTERM, and the clean exit the contract promises; killed (by process group) if not."""
    try:
        service.send_signal(signal.SIGTERM)
        code = service.wait(timeout=15)
        assert code == 0, f"service exited {code} on SIGTERM:\n{log_path.read_text()}"
    finally:
        if service.poll() is None:
            os.killpg(service.pid, signal.SIGKILL)
            service.wait(timeout=10)


def poll(probe: Callable[[], T | None], *, timeout: float, what: str, interval: float = 0.2) -> T:
    """Call ``probe`` until it returns something other than None; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{stderr}"
    return lines[0]
