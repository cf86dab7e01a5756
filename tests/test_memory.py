"""Memory freed at start-up goes back to the system (slotcron.service.memory)."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = """
import sys
from slotcron.service import memory

def rss():
    return int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0])

# 100 MB in blocks too large for Python's own allocator (malloc's heap), freed but for the last:
# it holds the heap's top, so free() alone can give nothing back.
blocks = [bytearray(2000) for _ in range(50_000)]
keep = blocks[-1]
del blocks
before = rss()
asked = memory.give_back()
print(asked, before, rss())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RSS read off /proc")
def test_give_back_returns_freed_heap_pages_to_the_system() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=True
    )
    asked, before, after = done.stdout.split()
    assert asked == "True", "glibc's malloc_trim was not found"
    assert int(before) - int(after) > 50_000, (before, after)  # kB: most of the 100 MB
