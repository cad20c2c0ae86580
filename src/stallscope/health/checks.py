"""What a doctor finding is: a ``Check`` with its status and the number behind it, and the report holding them.

Checks are data, not prose for one screen: the terminal table, the ``--json`` file and the session (through
``quick_checks``) all carry the same fields, so the diagnosis can read ``data`` instead of parsing ``value``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

DOCTOR_SCHEMA = "stallscope.health/1"

PASS = "pass"
WARN = "warn"
FAIL = "fail"
NA = "n/a"
UNKNOWN = "unknown"

#: Every status a check may have, best first. ``unknown`` means the source could not be read; ``n/a`` means the
#: check does not apply here (no GPU, no dataset given).
STATUSES: tuple[str, ...] = (PASS, WARN, FAIL, NA, UNKNOWN)


@dataclass(frozen=True)
class Check:
    """One finding: ``value`` is what was measured, ``threshold`` what it was compared against.

    ``data`` holds the same numbers as plain JSON values (bytes, counts, ratios) for programs; ``value`` and
    ``threshold`` are short human strings. ``why`` says what the number costs a training job, ``fix`` what to do.
    """

    id: str
    title: str
    status: str
    value: str
    threshold: str = ""
    why: str = ""
    fix: str = ""
    data: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"check {self.id!r}: status {self.status!r} is not one of {STATUSES}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "title": self.title,
            "status": self.status,
            "value": self.value,
            "threshold": self.threshold,
            "why": self.why,
            "fix": self.fix,
            "data": dict(self.data),
        }

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Check:
        return cls(
            id=str(raw["id"]),
            title=str(raw.get("title", raw["id"])),
            status=str(raw["status"]),
            value=str(raw.get("value", "")),
            threshold=str(raw.get("threshold", "")),
            why=str(raw.get("why", "")),
            fix=str(raw.get("fix", "")),
            data=dict(raw.get("data") or {}),
        )


def unknown(id: str, title: str, reason: str, why: str = "", fix: str = "", **data: Any) -> Check:
    """A check whose source could not be read: says why, and never carries a guessed value."""
    return Check(id=id, title=title, status=UNKNOWN, value=f"unknown: {reason}", why=why, fix=fix,
                 data={"reason": reason, **data})


def not_applicable(id: str, title: str, reason: str, **data: Any) -> Check:
    return Check(id=id, title=title, status=NA, value=reason, data={"reason": reason, **data})


@dataclass(frozen=True)
class DoctorReport:
    """All checks of one doctor run, in the order they were made (machine, software, GPU, dataset)."""

    checks: tuple[Check, ...]
    data_dir: str | None = None
    elapsed_s: float = 0.0

    def by_id(self, check_id: str) -> Check | None:
        return next((c for c in self.checks if c.id == check_id), None)

    def count(self, status: str) -> int:
        return sum(1 for c in self.checks if c.status == status)

    @property
    def worst(self) -> str:
        """``fail`` if any check failed, else ``warn`` if any warned, else ``pass``."""
        statuses = {c.status for c in self.checks}
        return FAIL if FAIL in statuses else WARN if WARN in statuses else PASS

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": DOCTOR_SCHEMA,
            "data_dir": self.data_dir,
            "elapsed_s": round(self.elapsed_s, 3),
            "checks": [c.to_dict() for c in self.checks],
        }

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> DoctorReport:
        if raw.get("schema") != DOCTOR_SCHEMA:
            raise ValueError(f"not a doctor report: schema {raw.get('schema')!r}, expected {DOCTOR_SCHEMA!r}")
        return cls(
            checks=tuple(Check.from_dict(c) for c in raw.get("checks", [])),
            data_dir=raw.get("data_dir"),
            elapsed_s=float(raw.get("elapsed_s", 0.0)),
        )


def fmt_bytes(n: float | int | None) -> str:
    """Binary units, three significant digits: what people compare against ``df -h`` and ``free -h``."""
    if n is None:
        return "?"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            if unit == "B":
                return f"{int(value)} B"
            return f"{value:.3g} {unit}" if value < 100 else f"{value:.0f} {unit}"
        value /= 1024
    return f"{value:.0f} TiB"  # unreachable; keeps type checkers calm


def fmt_rate(bytes_per_s: float | None) -> str:
    return "?" if bytes_per_s is None else f"{fmt_bytes(bytes_per_s)}/s"
