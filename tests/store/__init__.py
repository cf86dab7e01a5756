"""The store conformance suite: every public function of ``slotcron.store``'s modules, asserted
by what it leaves in the tables, on every backend (the ``db`` fixture runs each test on SQLite,
PostgreSQL and MariaDB). ``test_coverage.py`` keeps it complete."""
