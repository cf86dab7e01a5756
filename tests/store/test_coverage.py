"""The suite's own completeness: every public function of the store modules it covers is called
by some code in tests/store/ (read with ``ast``, not imported or run), so a function added to the
store without a conformance test fails here, named."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import slotcron.store

STORE = Path(slotcron.store.__file__).parent
SUITE = Path(__file__).parent

NOT_COVERED_HERE = frozenset({"__init__", "database", "engine", "pool", "tables", "migrate"})
"""Store modules this suite leaves out: the plumbing every other test exercises (and
``dialects/``, a package of its own)."""

ALLOWED: dict[str, str] = {
    # "module.function": "why it is reachable only through a running service",
}
"""Public store functions no test here calls, each with the reason. Keep it short: empty so
far, since every function can be called on a bare database."""


@functools.cache
def covered_modules() -> list[str]:
    return sorted(p.stem for p in STORE.glob("*.py") if p.stem not in NOT_COVERED_HERE)


def public_functions(module: str) -> set[str]:
    tree = ast.parse((STORE / f"{module}.py").read_text(), filename=f"{module}.py")
    return {
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and not node.name.startswith("_")
    }


def calls_in(path: Path) -> set[tuple[str, str]]:
    """The ``(module, function)`` of each store function ``path`` calls: as an attribute of a
    module imported from ``slotcron.store``, or by a name imported from one of its modules."""
    tree = ast.parse(path.read_text(), filename=str(path))
    modules: dict[str, str] = {}
    names: dict[str, tuple[str, str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "slotcron.store":
            for alias in node.names:
                modules[alias.asname or alias.name] = alias.name
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("slotcron.store."):
            module = (node.module or "").removeprefix("slotcron.store.")
            for alias in node.names:
                names[alias.asname or alias.name] = (module, alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("slotcron.store.") and alias.asname:
                    modules[alias.asname] = alias.name.removeprefix("slotcron.store.")
    found: set[tuple[str, str]] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            if func.value.id in modules:
                found.add((modules[func.value.id], func.attr))
        elif isinstance(func, ast.Name) and func.id in names:
            found.add(names[func.id])
    return found


@functools.cache
def suite_calls() -> frozenset[tuple[str, str]]:
    return frozenset(call for path in sorted(SUITE.glob("*.py")) for call in calls_in(path))


def test_every_public_store_function_is_called_by_the_conformance_suite() -> None:
    called = suite_calls()
    missing = sorted(
        f"{module}.{function}"
        for module in covered_modules()
        for function in public_functions(module)
        if (module, function) not in called and f"{module}.{function}" not in ALLOWED
    )
    assert not missing, (
        "public store functions no test in tests/store/ calls (add a test, or allow-list one "
        "only reachable through a running service, saying why): " + ", ".join(missing)
    )


def test_the_allow_list_names_only_public_store_functions_not_called() -> None:
    called = suite_calls()
    for entry, why in ALLOWED.items():
        module, _, function = entry.partition(".")
        assert module in covered_modules() and function in public_functions(module), entry
        assert (module, function) not in called, f"{entry} is called now: drop it from ALLOWED"
        assert why.strip(), f"{entry}: say why"


def test_the_scan_sees_the_modules_and_calls_it_is_about() -> None:
    """The checker itself: it finds the store's modules and the calls made here (a scan that
    found nothing would pass the test above vacuously)."""
    modules = covered_modules()
    assert {"claims", "batch", "batch_statements", "schedules", "timeline"} <= set(modules)
    assert not NOT_COVERED_HERE & set(modules)
    assert "claim_slot" in public_functions("claims")
    assert "_verdict" not in public_functions("claims")
    called = suite_calls()
    assert ("claims", "claim_slot") in called and ("leadership", "take") in called
    assert sum(len(public_functions(m)) for m in modules) >= 100
