"""Emitters and collector agree on every event's fields, checked on the source (the round trip through the real
recorder is tests/e2e/test_event_round_trip.py)."""

from __future__ import annotations

import ast
from pathlib import Path

from stallscope.recorder import schema

RECORD = Path(schema.__file__).parent


def _emit_calls() -> list[tuple[str, int, str]]:
    """(kind, number of fields, where) of every ``events.emit("kind", ...)`` (or ``events.append``, which never
    flushes) in the recorder's source."""
    found = []
    for path in sorted(RECORD.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            name = getattr(node.func, "attr", getattr(node.func, "id", None)) if isinstance(node, ast.Call) else None
            if name == "append" and getattr(getattr(node.func, "value", None), "id", None) != "events":
                continue  # a list's append, not the recorder's
            if isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name)) \
                    and name in ("emit", "append") and node.args \
                    and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                found.append((node.args[0].value, len(node.args) - 1, f"{path.name}:{node.lineno}"))
    return found


def test_every_emitted_kind_is_in_the_schema_with_as_many_fields() -> None:
    calls = _emit_calls()
    assert len(calls) > 20
    for kind, count, where in calls:
        assert kind in schema.EVENT_FIELDS, f"{where}: {kind!r} is not in record/schema.py"
        assert count == len(schema.EVENT_FIELDS[kind]), f"{where}: {kind!r} writes {count} fields, " \
                                                        f"the schema names {len(schema.EVENT_FIELDS[kind])}"
    queued = {kind for kind, _, _ in calls}
    # gpu spans are queued by cuda_timing and emitted through one generic call; the rest must all be written
    unwritten = set(schema.EVENT_FIELDS) - queued - {"ddp"}
    assert unwritten == set(), f"kinds in the schema that nothing writes: {unwritten}"
