"""A job module that raises while it is imported: ``check`` and ``run`` exit 2 with one line
naming the module, the error, and the file and line where it was raised in the user's code;
the whole traceback is logged at DEBUG (issue 27).

Run as the real console script (see ``tests/test_cli.py``) against SQLite in a temp dir.
"""

from __future__ import annotations

import pytest

from tests.cli import Cli, one_line
from tests.test_cli import cli

__all__ = ["cli"]  # the fixture, shared with test_cli.py


def test_an_error_raised_importing_a_job_module_names_its_file_and_line(cli: Cli) -> None:
    cli.write_module("boom2", "import asyncio\n\nratio = 1 / 0\n")
    done = cli("check", "--jobs", "boom2")
    assert done.returncode == 2
    line = one_line(done.stderr)
    assert "importing 'boom2' failed: ZeroDivisionError: division by zero" in line
    assert f"(file {cli.cwd / 'boom2.py'}, line 3)" in line
    assert "Traceback" not in done.stderr


def test_the_innermost_frame_of_the_users_code_is_named_not_the_library_it_called(
    cli: Cli,
) -> None:
    # The job module imports a helper of the project's that calls the standard library with
    # bad input: the line named is the helper's call, not json's insides nor the job module's.
    cli.write_module("helpers", 'import json\n\n\ndef load():\n    return json.loads("{")\n')
    cli.write_module("jobs3", "from helpers import load\n\nCONFIG = load()\n")
    done = cli("check", "--jobs", "jobs3")
    assert done.returncode == 2
    line = one_line(done.stderr)
    assert "importing 'jobs3' failed: JSONDecodeError:" in line
    assert f"(file {cli.cwd / 'helpers.py'}, line 5)" in line


def test_a_syntax_error_names_its_file_and_line(cli: Cli) -> None:
    cli.write_module("broken", "x = 1\n\ndef f(:\n    pass\n")
    done = cli("check", "--jobs", "broken")
    assert done.returncode == 2
    line = one_line(done.stderr)
    assert "importing 'broken' failed: SyntaxError" in line
    assert f"(file {cli.cwd / 'broken.py'}, line 3)" in line


@pytest.mark.parametrize("command", ["check", "run"])
def test_the_whole_traceback_is_logged_at_debug(cli: Cli, command: str) -> None:
    cli.write_module("boom2", "import asyncio\n\nratio = 1 / 0\n")
    done = cli(command, "--jobs", "boom2", env={"SCHEDULER_LOG_LEVEL": "DEBUG"})
    assert done.returncode == 2
    assert "Traceback (most recent call last)" in done.stderr
    assert "ratio = 1 / 0" in done.stderr
    assert done.stderr.rstrip().splitlines()[-1].startswith("slotcron: error: --jobs")
