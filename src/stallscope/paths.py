"""Where sessions live: ``./.stallscope`` unless ``--store`` or ``STALLSCOPE_HOME`` says otherwise."""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path

from stallscope.constants import DEFAULT_STORE_DIRNAME
from stallscope.settings import ENV_HOME


def store_dir(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The store directory, resolved in order: explicit argument, environment, working directory."""
    if explicit:
        return Path(explicit).expanduser().resolve()
    env = os.environ.get(ENV_HOME)
    if env:
        return Path(env).expanduser().resolve()
    return (Path.cwd() / DEFAULT_STORE_DIRNAME).resolve()


def runs_dir(store: Path) -> Path:
    return store / "runs"


def new_run_id(now: float | None = None) -> str:
    """Sortable by time and unique across concurrent runs writing the same store."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now if now is not None else time.time()))
    return f"{stamp}-{secrets.token_hex(3)}"


def resolve_run(ref: str, store: Path) -> Path:
    """Find a saved run from a path, a run id, a unique id prefix, or ``last``.

    A run whose session was never saved (its launcher was killed, or the disk was full) resolves to its
    run directory, for ``collect.recover_session``; ``last`` is the last saved session.
    Raises ``FileNotFoundError`` with the places it looked, so the CLI can say them.
    """
    candidate = Path(ref).expanduser()
    if candidate.is_file():
        return candidate
    if candidate.is_dir() and (candidate / "session.json").is_file():
        return candidate / "session.json"
    if candidate.is_dir() and (candidate / "run.json").is_file():
        return candidate
    base = runs_dir(store)
    runs = sorted(p for p in base.glob("*") if (p / "session.json").is_file()) if base.is_dir() else []
    if ref == "last":
        if not runs:
            raise FileNotFoundError(f"no saved runs under {base}")
        return runs[-1] / "session.json"
    unsaved = sorted(p for p in base.glob("*") if (p / "run.json").is_file() and not (p / "session.json").is_file()
                     ) if base.is_dir() else []
    matches = [p for p in runs + unsaved if p.name.startswith(ref)]
    if len(matches) == 1:
        return matches[0] / "session.json" if matches[0] in runs else matches[0]
    if len(matches) > 1:
        names = ", ".join(p.name for p in matches[:5])
        raise FileNotFoundError(f"run id {ref!r} is ambiguous under {base}: {names}")
    raise FileNotFoundError(f"no run {ref!r}: not a session file, run directory, or run id under {base}")
