"""Where an instance's memory goes: RSS, and Python's allocations by package (tracemalloc).

    python -m bench.memory                 # idle, 10,000 jobs, PostgreSQL
    python -m bench.memory --jobs 500 --cron "* * * * * *"    # a steady instance

Two runs of the same instance: one untraced, for its RSS (``VmRSS`` and ``VmHWM``) as the
service runs it; one under ``python -X tracemalloc``, whose snapshot (taken once the instance has
settled) is grouped by the package that allocated each block, innermost frame first: what
``import`` keeps (modules, classes, functions) and what the jobs and their runs keep.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bench.run import ROOT, Proc, Slotcron, wait_for
from tests import backends


def package(filename: str) -> str:
    """The top-level package a source file belongs to (``<frozen ...>`` as it is)."""
    if filename.startswith("<"):
        return filename
    path = Path(filename)
    parts = path.parts
    for marker in ("site-packages", "app"):
        if marker in parts:
            rest = parts[parts.index(marker) + 1 :]
            if rest:
                top = rest[0]
                if top == "slotcron" and len(rest) > 2:
                    return f"slotcron.{rest[1]}"
                return top.removesuffix(".py")
    if "bench" in parts:
        return "bench"
    if "lib" in parts and any(p.startswith("python3") for p in parts):
        return "stdlib"
    return str(path)


def by_package(snapshot: tracemalloc.Snapshot) -> Counter[str]:
    sizes: Counter[str] = Counter()
    for stat in snapshot.statistics("traceback"):
        frames = list(stat.traceback)
        # Innermost frame outside the standard library: who asked (not which stdlib helper).
        owner = next((f for f in reversed(frames) if package(f.filename) != "stdlib"), None)
        sizes[package((owner or frames[-1]).filename)] += stat.size
    return sizes


def by_site(snapshot: tracemalloc.Snapshot, prefix: str) -> Counter[str]:
    """Python's allocations by the innermost frame in a package whose name starts with
    ``prefix`` (``slotcron``: which line of ours keeps what); the rest under "elsewhere"."""
    sizes: Counter[str] = Counter()
    for stat in snapshot.statistics("traceback"):
        ours = next(
            (f for f in reversed(stat.traceback) if package(f.filename).startswith(prefix)), None
        )
        where = "elsewhere" if ours is None else f"{_short(ours.filename)}:{ours.lineno}"
        sizes[where] += stat.size
    return sizes


def _short(filename: str) -> str:
    parts = Path(filename).parts
    for marker in ("slotcron", "bench"):
        if marker in parts:
            return "/".join(parts[len(parts) - parts[::-1].index(marker) - 1 :])
    return filename


def start(system: Slotcron, jobs: int, cron: str, env: dict[str, str], frames: int) -> Proc:
    """One instance, as :meth:`Slotcron.start` starts it; under tracemalloc when ``frames``."""
    if not frames:
        proc = system.start(0, jobs, cron)
    else:
        argv = [sys.executable, "-X", f"tracemalloc={frames}", "-m", "slotcron", "run",
                "--jobs", "bench.memory_jobs"]  # fmt: skip
        proc = system._spawn(
            "slotcron-0", argv, {**_instance_env(system, jobs, cron), **env}, False
        )
    wait_for(proc.is_ready, 600, "the instance to start")
    return proc


def _instance_env(system: Slotcron, jobs: int, cron: str) -> dict[str, str]:
    return {
        "SCHEDULER_DATABASE_URL": system.url,
        "SCHEDULER_INSTANCE_ID": "slotcron-0",
        "BENCH_JOBS": str(jobs),
        "BENCH_CRON": cron,
        "BENCH_OUT": str(system.workdir / "slotcron-0.starts"),
        "SCHEDULER_MAX_CONCURRENCY": str(max(jobs, 1000)),
    }


def measure(
    backend: str,
    jobs: int,
    cron: str,
    settle: float,
    frames: int,
    untraced: bool = True,
    sites: int = 0,
) -> None:
    for traced in ((0,) if untraced else ()) + ((frames,) if frames else ()):
        with tempfile.TemporaryDirectory(prefix="slotcron-memory-") as tmp:
            url = backends.create_database(backend, Path(tmp))
            system = Slotcron(url, Path(tmp))
            try:
                system.prepare(jobs, cron)
                snapshot_path = Path(tmp) / "snapshot"
                env = {"BENCH_SNAPSHOT": str(snapshot_path)}
                proc = start(system, jobs, cron, env, traced)
                time.sleep(settle)
                if not traced:
                    print(
                        f"untraced: VmRSS {proc.memory_mb('VmRSS'):.1f} MB, "
                        f"peak (VmHWM) {proc.memory_mb('VmHWM'):.1f} MB",
                        flush=True,
                    )
                    continue
                proc.popen.send_signal(signal.SIGUSR2)
                wait_for(snapshot_path.exists, 60, "the snapshot")
                time.sleep(1)  # written whole
                snapshot = tracemalloc.Snapshot.load(str(snapshot_path))
                sizes = by_package(snapshot)
                total = sum(sizes.values())
                print(f"traced ({frames} frames): {total / 2**20:.1f} MB allocated by Python")
                for name, size in sizes.most_common(25):
                    print(f"  {size / 2**20:7.2f} MB  {name}")
                if sites:
                    print(f"the {sites} lines of slotcron that keep the most:")
                    for where, size in by_site(snapshot, "slotcron").most_common(sites + 1):
                        if where != "elsewhere":
                            print(f"  {size / 2**20:7.2f} MB  {where}")
            finally:
                system.stop_all()
                backends.drop_database(backend, url)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", default="postgresql")
    parser.add_argument("--jobs", type=int, default=10_000)
    later = datetime.now(UTC) + timedelta(hours=2)
    parser.add_argument("--cron", default=f"0 {later.minute} {later.hour} * * *")
    parser.add_argument("--settle", type=float, default=20.0)
    parser.add_argument("--frames", type=int, default=10, help="0: RSS only")
    parser.add_argument("--traced-only", action="store_true")
    parser.add_argument(
        "--sites", type=int, default=0, help="also the N lines of slotcron that keep the most"
    )
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    measure(
        args.backend,
        args.jobs,
        args.cron,
        args.settle,
        args.frames,
        not args.traced_only,
        args.sites,
    )


if __name__ == "__main__":
    main()
