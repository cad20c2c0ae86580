"""Weights & Biases: the script's own run, resumed by id in the script's mode, else a new run.

Metrics go to the run's summary, not its history: a history row would add a step after the script's last
one to its charts. The verdict and stage are run tags (``verdict:input-bound``) and, with the run id and
version, config values. The files are saved into the run's folder (uploaded with it, or by ``wandb sync``
for an offline run). Nothing here asks W&B for more than the run needs: no console capture, no system
stats, no git or code lookups.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from stallscope.session import Session
from stallscope.trackers import metrics, script_run


def require() -> None:
    import wandb  # noqa: F401 - ImportError here is the caller's "install stallscope[wandb]"


def log(summary: dict[str, Any], session: Session, files: list[Path], *, project: str | None = None) -> str:
    import wandb

    settings = wandb.Settings(console="off", silent=True, disable_git=True, save_code=False, x_disable_stats=True,
                              x_disable_meta=True, x_save_requirements=False)
    script = script_run(session, "wandb")
    attach = script is not None and project in (None, script.get("project"))
    if attach:
        assert script is not None
        run = wandb.init(id=script["run_id"], project=script.get("project"), entity=script.get("entity") or None,
                         dir=script.get("dir") or None, mode=script.get("mode") or None, resume="allow",
                         settings=settings)
    else:
        run = wandb.init(project=project or os.environ.get("WANDB_PROJECT") or "stallscope",
                         name=f"stallscope-{session.run_id}", job_type="stallscope", settings=settings)
    try:
        tags = metrics.tags(summary)
        run.summary.update(metrics.flat_metrics(summary))
        run.config.update(tags, allow_val_change=True)
        labels = {f"{name}:{tags[metrics.PREFIX + name]}" for name in ("verdict", "bottleneck")
                  if metrics.PREFIX + name in tags}
        run.tags = tuple(dict.fromkeys([*(run.tags or ()), *sorted(labels)]))
        for path in files:
            kept = shutil.copyfile(path, Path(run.dir) / path.name)  # the run's folder outlives our temporary one
            run.save(str(kept), base_path=run.dir, policy="now")
        whose = "the script's own" if attach else "new"
        where = f"W&B run {run.id} ({whose}, {run.settings.mode}) in {run.dir}"
    finally:
        run.finish(exit_code=session.exit_code)
        wandb.teardown()
    return where
