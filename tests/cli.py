"""The one way the tests run the command line: ``slotcron`` in a process of its own, with no
``SCHEDULER_*`` variable from the test's own environment but the database URL and what a test
adds. Used by every CLI test (tests/test_cli*.py, tests/integration/test_migrations.py).

A command is forked from a process that has the command line imported already
(tests/cli_zygote.py: a second a command saved); ``SLOTCRON_TEST_CLI=subprocess`` starts a new
interpreter for each instead. ``slotcron run`` (:meth:`Cli.start`) always starts one."""

from __future__ import annotations

import atexit
import base64
import json
import locale
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
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


ZYGOTE = Path(__file__).with_name("cli_zygote.py")


class _Zygote:
    """This test process's link to its tests/cli_zygote.py (started at its first command)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.process: subprocess.Popen[str] | None = None
        self.scratch = Path(tempfile.mkdtemp(prefix="slotcron-cli-"))

    def run(
        self, argv: list[bytes], env: dict[str, str], cwd: Path, timeout: float
    ) -> tuple[int, bytes, bytes] | None:
        """The command's status and output; None when the zygote is busy with another thread's
        command (the caller starts an interpreter instead)."""
        if not self.lock.acquire(blocking=False):
            return None
        try:
            process = self._process()
            out, err = self.scratch / "out", self.scratch / "err"
            request = {
                "argv": [base64.b64encode(a).decode() for a in argv],
                "env": env,
                "cwd": str(cwd),
                "out": str(out),
                "err": str(err),
                "timeout": timeout,
            }
            assert process.stdin is not None and process.stdout is not None
            process.stdin.write(json.dumps(request) + "\n")
            process.stdin.flush()
            line = process.stdout.readline()
            if not line:
                self.process = None
                raise RuntimeError(f"the CLI zygote died (exit {process.wait()})")
            reply = json.loads(line)
            if reply.get("timeout"):
                raise subprocess.TimeoutExpired(["slotcron", *map(os.fsdecode, argv)], timeout)
            return int(reply["code"]), out.read_bytes(), err.read_bytes()
        finally:
            self.lock.release()

    def _process(self) -> subprocess.Popen[str]:
        if self.process is None or self.process.poll() is not None:
            self.process = subprocess.Popen(
                [sys.executable, str(ZYGOTE)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
        return self.process

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.close()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        for name in ("out", "err"):
            (self.scratch / name).unlink(missing_ok=True)
        self.scratch.rmdir()


_ZYGOTE = _Zygote() if os.environ.get("SLOTCRON_TEST_CLI") != "subprocess" else None
if _ZYGOTE is not None:
    atexit.register(_ZYGOTE.close)


def _decoded(data: bytes) -> str:
    """As ``subprocess.run(text=True)`` decodes a stream."""
    text = data.decode(locale.getpreferredencoding(False))
    return text.replace("\r\n", "\n").replace("\r", "\n")


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
        seconds = self.timeout if timeout is None else timeout
        argv = [*self.prefix, *args]
        environ = self.env(env)
        forked = self._forked([os.fsencode(a) for a in argv], environ, seconds)
        if forked is not None:
            code, out, err = forked
            return subprocess.CompletedProcess(
                ["slotcron", *argv], code, _decoded(out), _decoded(err)
            )
        return subprocess.run(
            [*COMMAND, *argv],
            cwd=self.cwd,
            env=environ,
            capture_output=True,
            text=True,
            timeout=seconds,
            check=False,
        )

    def _forked(
        self, argv: list[bytes], env: dict[str, str], timeout: float
    ) -> tuple[int, bytes, bytes] | None:
        return None if _ZYGOTE is None else _ZYGOTE.run(argv, env, self.cwd, timeout)

    def run_bytes(self, args: list[str | bytes], env: dict[str, str]) -> tuple[int, str, str]:
        """Arguments that may not be valid UTF-8; output decoded with replacement."""
        argv = [a if isinstance(a, bytes) else a.encode() for a in args]
        environ = self.env(env)
        forked = self._forked(argv, environ, 30)
        if forked is not None:
            code, out_bytes, err_bytes = forked
            return code, out_bytes.decode("utf-8", "replace"), err_bytes.decode("utf-8", "replace")
        return self.run_started(argv, environ)

    def run_started(self, argv: list[bytes], environ: dict[str, str]) -> tuple[int, str, str]:
        """``argv`` in a new interpreter (never forked), with exactly ``environ``."""
        done = subprocess.run(
            [*(c.encode() for c in COMMAND), *argv],
            cwd=self.cwd,
            env=environ,
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
