"""Argument types the verbs share: light enough for every verb to import (no rich, no torch)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def at_least(minimum: float, kind: type = int) -> Callable[[str], float]:
    """An argparse ``type`` for a number of ``kind`` no lower than ``minimum`` (and finite): ``--limit -1`` or
    ``--batch-size 0`` are refused with a usage error instead of being run."""
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a{'n integer' if kind is int else ' number'}: {text!r}") from None
        if not math.isfinite(value) or value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum:g}, not {text}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse
