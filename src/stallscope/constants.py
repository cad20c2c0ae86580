"""Names shared by every layer: node ids, schema versions, the store's folder name.

Environment variables and the ``--set`` vocabulary are ``stallscope.settings``'s."""

from __future__ import annotations

#: The seven stages of an input pipeline, in pipeline order. Stable ids used in every output.
NODE_IDS: tuple[str, ...] = ("storage", "decode", "transform", "loader", "transfer", "compute", "sync")

#: Nodes that sit in front of the model: a fix on one of these is an "input-side" fix.
INPUT_NODES: tuple[str, ...] = ("storage", "decode", "transform", "loader", "transfer")

SESSION_SCHEMA = "stallscope.session/1"
SUMMARY_SCHEMA = "stallscope.summary/1"
PLAN_SCHEMA = "stallscope.plan/1"

DEFAULT_STORE_DIRNAME = ".stallscope"
#: The store's run history (SQLite), beside its ``runs/`` folder.
HISTORY_FILENAME = "history.sqlite3"

#: The launcher's note when the run's folder disappeared while the job ran (a cleanup script, ``rm -rf``): it
#: begins every such note, so the analysis tells "events lost" from "the recorder never started".
EVENTS_LOST_NOTE = "the run's folder was removed while the job ran"
#: Words in each launcher note that says a signal reached the script ("stopped by SIGINT sent to stallscope",
#: "SIGINT was forwarded to the script, ..."): a job with no recorded process, such a note and a run shorter than
#: ``STARTING_S`` was stopped while Python started, before the recorder could, which is not the recorder failing.
SIGNAL_NOTE_WORDS = ("sent to stallscope", "forwarded to the script")
#: Seconds within which a Python job may still be starting (the interpreter, site, stallscope's recorder: well
#: under a second on a local disk, more on a slow network file system; calibration: job-starting-s).
STARTING_S = 10.0

#: CUDA runtime calls in which the host waits for the device. The profiler window's rows of these name the operator
#: that made them (``cudaStreamSynchronize < aten::_local_scalar_dense``: an ``.item()``; recorder/op_window.py).
SYNC_CALLS = frozenset({"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
                        "cudaMemcpyAsync"})
