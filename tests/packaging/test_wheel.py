"""What the wheel holds (issue 27): one top-level name, ``slotcron``, typed and licensed, with
Alembic's scripts and the dashboard's files inside it."""

from __future__ import annotations

import zipfile
from email.parser import Parser
from pathlib import Path

from tests.packaging.conftest import ROOT

SOURCE = ROOT / "app" / "slotcron"


def names(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        return archive.namelist()


def metadata(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as archive:
        (path,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        return archive.read(path).decode()


def test_the_wheel_installs_exactly_one_top_level_name(wheel: Path) -> None:
    top = {name.split("/")[0] for name in names(wheel)}
    assert {t for t in top if not t.endswith(".dist-info")} == {"slotcron"}
    with zipfile.ZipFile(wheel) as archive:
        for record in [n for n in archive.namelist() if n.endswith(".dist-info/top_level.txt")]:
            assert archive.read(record).decode().split() == ["slotcron"]


def test_it_is_typed_and_licensed(wheel: Path) -> None:
    files = names(wheel)
    assert "slotcron/py.typed" in files
    licenses = [n for n in files if n.endswith("/LICENSE") and ".dist-info/" in n]
    assert licenses, files
    with zipfile.ZipFile(wheel) as archive:
        assert "MIT License" in archive.read(licenses[0]).decode()
    meta = Parser().parsestr(metadata(wheel))
    assert meta["License-Expression"] == "MIT"
    assert "Typing :: Typed" in meta.get_all("Classifier", [])
    assert meta.get_all("Project-URL")


def test_alembic_scripts_ship_inside_the_package(wheel: Path) -> None:
    files = set(names(wheel))
    assert {"slotcron/migrations/env.py", "slotcron/migrations/script.py.mako"} <= files
    versions = sorted(p.name for p in (SOURCE / "migrations" / "versions").glob("*.py"))
    assert len(versions) >= 8
    assert {f"slotcron/migrations/versions/{v}" for v in versions} <= files
    assert not any(n.startswith(("migrations/", "app/")) for n in files)


def test_the_dashboard_files_ship_inside_the_package(wheel: Path) -> None:
    static = sorted(p.name for p in (SOURCE / "http" / "static").iterdir() if p.is_file())
    assert static
    assert {f"slotcron/http/static/{name}" for name in static} <= set(names(wheel))


def test_every_module_of_the_source_is_in_the_wheel(wheel: Path) -> None:
    source = {
        "slotcron/" + p.relative_to(SOURCE).as_posix()
        for p in SOURCE.rglob("*.py")
        if "__pycache__" not in p.parts
    }
    assert source - set(names(wheel)) == set()
