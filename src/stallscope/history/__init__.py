"""Run history: every run's figures as a row (``runs``), kept in SQLite (``store``), compared with a
noise test (``compare``)."""
