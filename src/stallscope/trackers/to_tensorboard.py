"""TensorBoard: scalars and text in an event file, the files beside it.

TensorBoard has no run to attach to, only folders: the script's own ``SummaryWriter`` folder when it had
one (TensorBoard shows every event file of a folder as one run, so ours joins the script's), else
``--dir``, else ``./runs/stallscope/RUN_ID``. Scalars are written at the run's last step.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from stallscope.session import Session
from stallscope.trackers import metrics, script_run


def require() -> None:
    import tensorboard  # noqa: F401 - ImportError here is the caller's "install stallscope[tensorboard]"
    from torch.utils.tensorboard import SummaryWriter  # noqa: F401


def default_dir(session: Session) -> Path:
    """Where a run goes when neither the script nor the user named a folder."""
    return Path("runs", "stallscope", session.run_id)


def log(summary: dict[str, Any], session: Session, files: list[Path], *, log_dir: str | None = None) -> str:
    from torch.utils.tensorboard import SummaryWriter

    script = script_run(session, "tensorboard")
    folder = Path(log_dir) if log_dir else Path(script["log_dir"]) if script else default_dir(session)
    step = int(summary.get("steps") or 0)
    writer = SummaryWriter(log_dir=str(folder))
    try:
        for name, value in metrics.flat_metrics(summary).items():
            writer.add_scalar(name, value, global_step=step)
        for name, text in metrics.tags(summary).items():
            writer.add_text(name, text, global_step=step)
    finally:
        writer.close()
    for path in files:
        shutil.copyfile(path, folder / path.name)
    whose = " (the script's own)" if script and not log_dir else ""
    return f"TensorBoard log dir {folder.resolve()}{whose}"
