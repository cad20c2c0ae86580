"""Names shared by every layer: node ids, schema versions, the store's folder name.

Environment variables and the ``--set`` vocabulary are ``stallscope.settings``'s."""

from __future__ import annotations

import os
import sysconfig

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

#: The standard library's folders, and the path fragments of installed packages and of the frameworks' own folders
#: (wherever they are installed: a PYTHONPATH target, a checkout): frames there are not the user's own code.
LIBRARY_ROOTS = tuple(
    os.path.normpath(p) + os.sep for p in {sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib")} if p)
_LIBRARY_PARTS = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}",
                  *(f"{os.sep}{name}{os.sep}" for name in ("torch", "transformers", "accelerate", "lightning",
                                                          "pytorch_lightning", "lightning_fabric")))


def is_user_file(path: str) -> bool:
    """A file of the user's own code: not the standard library's, an installed package's or a framework's, and
    not ``<string>``-like code with no file."""
    if not path or path.startswith("<"):
        return False
    normalized = os.path.normpath(path)
    return not any(part in normalized for part in _LIBRARY_PARTS) and not normalized.startswith(LIBRARY_ROOTS)


#: Libraries known to download from threads of their own, by top-level package: a fetch's ``requests[8]`` names
#: one by its index (0: another, or none).
DOWNLOAD_LIBRARIES = ("", "streaming", "litdata", "s3transfer", "fsspec", "s3fs", "webdataset", "torchdata")
