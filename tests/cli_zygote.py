"""A process with slotcron's command line already imported, that forks one child per command.

``python -m slotcron`` spends about a second starting Python and importing SQLAlchemy, the
drivers and the CLI before it reads its arguments; the suite runs the command line hundreds of
times. This process pays that once per test worker: each command is still its own process, with
its own arguments (bytes, decoded as Python decodes them), environment, working directory (first
on ``sys.path``, as ``-m`` puts it), standard streams and exit status; only the interpreter's
start and the imports are shared. ``tests/cli.py`` talks to it; ``SLOTCRON_TEST_CLI=subprocess``
runs every command as a new interpreter instead, and tests/test_cli.py runs the console script.

Protocol: one JSON request per line on stdin (``argv`` as base64 strings, ``env``, ``cwd``,
``out``, ``err``: paths the child's stdout and stderr go to, ``timeout``); one JSON reply per
line on stdout: ``{"code": N}`` (negative: killed by that signal) or ``{"timeout": true}``.
"""

from __future__ import annotations

import atexit
import base64
import json
import os
import signal
import sys
import time
import traceback


def _child(request: dict) -> None:  # type: ignore[type-arg]
    """In the forked child: become ``slotcron ARGS`` and exit with its status."""
    code = 1
    try:
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        for fd, path in ((1, request["out"]), (2, request["err"])):
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(target, fd)
            os.close(target)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sys.argv = [
            sys.modules["slotcron.__main__"].__file__ or "slotcron",
            *(os.fsdecode(base64.b64decode(a)) for a in request["argv"]),
        ]
        sys.path[0] = os.getcwd()
        from slotcron.cli.main import main

        try:
            code = main()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if exc.code is not None and not isinstance(exc.code, int):
                print(exc.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
            code = 1
        try:
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:
            pass
    finally:
        os._exit(code)


def _serve() -> None:
    import importlib.util

    # Everything a command imports, imported once here.
    import slotcron.cli.main  # noqa: F401

    for name in ("asyncpg", "aiomysql", "aiosqlite", "alembic.command", "uvloop"):
        if importlib.util.find_spec(name.split(".")[0]) is not None:
            __import__(name)
    spec = importlib.util.find_spec("slotcron.__main__")
    module = type(sys)("slotcron.__main__")
    module.__file__ = spec.origin if spec is not None else None
    sys.modules["slotcron.__main__"] = module  # its __file__ only: importing it would run it

    replies = sys.stdout
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(request)
        deadline = time.monotonic() + float(request["timeout"])
        reply: dict[str, object]
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                reply = {"code": os.waitstatus_to_exitcode(status)}
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                reply = {"timeout": True}
                break
            time.sleep(0.002)
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


if __name__ == "__main__":
    _serve()
