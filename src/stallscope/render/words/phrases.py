"""The small phrases every kind of finding's words share: settings as ``--set`` says them, facts by name."""

from __future__ import annotations

from typing import Any

from stallscope.settings import format_value

MIB = 1 << 20
#: The parts of compute (``nodes.compute.parts``) as the reports name them.
PART_LABELS = {"forward": "forward", "backward": "backward", "optimizer": "optimizer", "step_code": "step code"}


def overrides(values: dict[str, Any]) -> str:
    """Overrides as the ``--set`` arguments that give them."""
    return " ".join(f"--set {k}={format_value(v)}" for k, v in values.items())


def facts_text(facts: dict[str, Any]) -> str:
    """A finding this version has no words for, said by its facts."""
    return ", ".join(f"{k}={v}" for k, v in facts.items())


def gain(rec: Any, short: bool = False) -> str:
    """A recommendation's predicted speedup: ``predicted 1.30x``; a ceiling (the step without the cost the change
    removes, where the change's own effect cannot be priced from the run) ``at most 1.30x``; a floor (the time the
    run shows lost, where more is lost than it can show) ``at least 1.30x``."""
    value = f"{rec.predicted_speedup:.2f}x"
    if rec.facts.get("ceiling"):
        return f"at most {value}"
    if rec.facts.get("floor"):
        return f"at least {value}"
    return value if short else f"predicted {value}"
