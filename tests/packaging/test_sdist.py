"""What the sdist holds (issue 28): the test tree whole (a partial one fails to collect), and
the files the documentation points at: ``.env.example``, ``deploy/``, ``docs/``, ``mkdocs.yml``,
``CHANGELOG.md``, ``LICENSE``."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path

import pytest

from tests.packaging.conftest import BUILD_TIMEOUT, ROOT

# Under -I, PYTHONPATH is ignored: the build requirements' directory is put first on sys.path
# by hand, so its setuptools is the one imported, not this environment's.
BUILD = """
import os, sys
sys.path.insert(0, os.environ["PYTHONPATH"])
import setuptools.build_meta as backend
print(backend.build_sdist(sys.argv[1]))
"""


def _run(argv: list[str], what: str, env: dict[str, str] | None = None) -> None:
    done = subprocess.run(
        argv,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, f"{what} failed:\n{done.stdout}\n{done.stderr}"


@pytest.fixture(scope="module")
def sdist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist, built once from this checkout in isolation, as ``pip wheel`` builds the
    wheel: pyproject's build requirements installed into a directory of their own (whatever
    setuptools this environment has), then its backend's ``build_sdist``."""
    backend = tmp_path_factory.mktemp("backend")
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    pip = [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(backend)]
    _run([*pip, *requires], "installing the build requirements")
    out = tmp_path_factory.mktemp("sdist")
    env = {**os.environ, "PYTHONPATH": str(backend)}
    _run([sys.executable, "-I", "-c", BUILD, str(out)], "build_sdist", env)
    (built,) = out.glob("slotcron-*.tar.gz")
    return built


def members(sdist: Path) -> set[str]:
    """Paths inside the archive, without its ``slotcron-<version>/`` prefix."""
    with tarfile.open(sdist) as archive:
        return {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}


def tracked(folder: str) -> set[str]:
    """The files of a folder of this checkout, as the sdist names them."""
    return {
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / folder).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }


def test_the_sdist_ships_the_whole_test_tree(sdist: Path) -> None:
    inside = members(sdist)
    tests = tracked("tests")
    assert {"tests/__init__.py", "tests/conftest.py", "tests/backends.py"} <= tests
    assert sorted(tests - inside) == []
    subfolders = {p.parent for p in map(Path, tests) if p.parent != Path("tests")}
    assert subfolders, "tests/ has subfolders"
    assert all(f"{folder.as_posix()}/__init__.py" in inside for folder in subfolders)


def test_the_sdist_ships_what_the_docs_point_at(sdist: Path) -> None:
    inside = members(sdist)
    wanted = {".env.example", "mkdocs.yml", "CHANGELOG.md", "LICENSE", "README.md"}
    assert sorted(wanted - inside) == []
    for folder in ("deploy", "docs"):
        files = tracked(folder)
        assert files, folder
        assert sorted(files - inside) == []


def test_the_sdist_ships_the_package_and_its_migrations(sdist: Path) -> None:
    inside = members(sdist)
    assert "pyproject.toml" in inside
    assert "app/slotcron/__init__.py" in inside
    assert "app/slotcron/migrations/env.py" in inside
