"""Every test under tests/e2e runs the real CLI in subprocesses: marked ``e2e`` here, so the fast lane
(``pytest -m "not e2e"``) never picks one up, whichever file it is in."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.e2e)
