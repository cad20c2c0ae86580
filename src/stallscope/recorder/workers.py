"""Inside DataLoader workers: who we are, when we started, and what each batch fetch cost.

A worker learns its identity (loader id, iterator id, worker id) from ``WorkerInit``, which
wraps the script's own ``worker_init_fn`` and is pickled to the worker under spawn and
forkserver. Each fetch is then recorded with wall time, thread CPU time, run-queue wait (from
``/proc/thread-self/schedstat``, to tell CPU starvation from blocking I/O), the minor page faults
the fetching thread took (fresh memory it touched: what makes its CPU second dearer when it shares
a core, ``analysis/cpu_load.py``'s ``FRESH_PAGES_FOR_FULL_SHARING_COST``) and the per-node split of
the library calls made inside it.
"""

from __future__ import annotations

import os
import threading
import time
import traceback
from typing import Any

from stallscope.recorder import calls, events, http_requests, stacks, step_parts, step_threads

_perf = time.perf_counter_ns
_cpu = time.thread_time_ns

#: (loader id, iterator id, worker id) of this worker process; None outside workers.
worker_context: tuple[int, int, int] | None = None
_fetch_seq: dict[tuple[int, int, int], int] = {}
#: Per context, the sequence number of the next batch whose library calls are timed (calls.timing_interval).
_next_timed_seq: dict[tuple[int, int, int], int] = {}


try:
    import resource

    _RUSAGE_THREAD = getattr(resource, "RUSAGE_THREAD", None)  # Linux only
except ImportError:  # not a Unix
    _RUSAGE_THREAD = None


def read_minor_faults() -> int:
    """Minor page faults this thread has taken (a page of fresh memory mapped, or one of the page cache), or -1
    where the platform does not count them per thread. One ``getrusage`` call, about a microsecond."""
    if _RUSAGE_THREAD is None:
        return -1
    try:
        return resource.getrusage(_RUSAGE_THREAD).ru_minflt
    except (OSError, ValueError):
        return -1


_schedstat_fds: dict[int, int] = {}


def read_runqueue_wait_ns() -> int:
    """Nanoseconds this thread has waited for a CPU, or -1 when the kernel does not say.

    Read twice per batch, so the file stays open and is re-read with ``pread`` (an open per read
    cost ~15 us on sandboxed kernels). The descriptor belongs to the thread that opened it, so it
    is kept per thread, and a forked child (a worker) drops its parent's and opens its own.
    """
    key = threading.get_ident()
    try:
        fd = _schedstat_fds.get(key)
        if fd is None:
            fd = _schedstat_fds[key] = os.open("/proc/thread-self/schedstat", os.O_RDONLY | os.O_CLOEXEC)
        return int(os.pread(fd, 256, 0).split()[1])
    except (OSError, ValueError, IndexError):
        return -1


def _forget_parent_schedstat() -> None:
    for fd in _schedstat_fds.values():
        try:
            os.close(fd)
        except OSError:
            pass
    _schedstat_fds.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_parent_schedstat)


class WorkerInit:
    """Picklable wrapper of the script's ``worker_init_fn`` that tells the worker who it is."""

    def __init__(self, user_fn: Any, loader_id: int, iter_id: int, created_ns: int) -> None:
        self.user_fn = user_fn
        self.loader_id = loader_id
        self.iter_id = iter_id
        self.created_ns = created_ns

    def __call__(self, worker_id: int) -> None:
        global worker_context
        entered = _perf()
        worker_context = (self.loader_id, self.iter_id, worker_id)
        events.set_role("worker")
        events.flush_at_process_exit()
        step_parts.leave_worker()
        http_requests.in_loader_worker()
        threads = _thread_settings()
        if self.user_fn is not None:
            try:
                self.user_fn(worker_id)
            except BaseException as exc:  # the worker's own failure, as in a fetch: torch re-raises it in the
                # training process as a "Caught ... in DataLoader worker process N" from its own internals
                emit_worker_error(self.loader_id, self.iter_id, worker_id, exc)
                raise
        events.emit("worker_start", self.loader_id, self.iter_id, worker_id, os.getpid(), self.created_ns,
                    entered, _perf(), threads)
        events.flush()


#: Frames kept of a worker's traceback, the innermost (where the user's code or a library raised) first to keep.
WORKER_TRACEBACK_FRAMES = 16


def emit_worker_error(loader_id: int, iter_id: int, worker_id: int, exc: BaseException) -> None:
    """An exception in a worker (its ``worker_init_fn``, a fetch: ``__getitem__``, ``collate_fn``), with its
    innermost frames, written out at once: the worker may be terminated as soon as the training process sees it."""
    events.emit("fetch_error", loader_id, iter_id, worker_id, os.getpid(), _perf(), type(exc).__name__,
                str(exc)[:2000], "".join(traceback.format_exception(exc, limit=-WORKER_TRACEBACK_FRAMES))[-4000:])
    events.flush()


def _thread_settings() -> dict[str, Any]:
    settings: dict[str, Any] = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    try:
        import torch

        settings["torch"] = torch.get_num_threads()
    except Exception:
        pass
    import sys

    cv2 = sys.modules.get("cv2")
    if cv2 is not None:
        try:
            settings["cv2"] = cv2.getNumThreads()
        except Exception:
            pass
    return settings


#: How often a worker writes its events out (after a batch): a batch slower than this is written with it.
WORKER_WRITE_EVERY_NS = 5_000_000
#: How often a worker writes its sampled stacks out: each write repeats every frame's file:line:function.
WORKER_STACKS_EVERY_NS = 250_000_000
_last_written = [0]  # perf_counter_ns of this worker's last write


def timed_fetch(original: Any) -> Any:
    """Wrap a fetcher's ``fetch`` so that every batch (or StopIteration) is one ``fetch`` event.

    Runs once per batch, in the training process itself when ``num_workers=0``: kept to a few calls.
    Library calls inside are timed in every batch, or in one of every few where that would cost more
    than ``calls.CALL_TIMING_BUDGET`` (the event's last field says which).
    The fetcher classes carry ``_stallscope_ctx = None`` (see ``loader.patch_fetchers``), so reading
    it is a hit in workers too."""

    def fetch(self: Any, possibly_batched_index: Any) -> Any:
        ctx = self._stallscope_ctx or worker_context
        if ctx is None:
            return original(self, possibly_batched_index)
        collate = self.collate_fn
        if not getattr(collate, "__stallscope_wrapped__", False):
            self.collate_fn = calls.timed_call(collate, "loader", "collate")
        seq = _fetch_seq.get(ctx, 0)
        _fetch_seq[ctx] = seq + 1
        timed = seq >= _next_timed_seq.get(ctx, 0)
        rq0, pf0 = read_runqueue_wait_ns(), read_minor_faults()
        in_process = ctx is not worker_context
        # the other threads' CPU meanwhile: in the training process, its watched Python threads (they hold the
        # interpreter); in a worker, the loader's own download threads (their CPU is loading's)
        others0 = step_threads.others_cpu_ns() if in_process else http_requests.loader_threads_cpu_ns()
        account = calls.begin_fetch() if timed else None
        http_requests.begin_batch()
        stacks.fetch_started(ctx[0])
        t0, c0 = _perf(), _cpu()
        if account is not None:
            account.mark_wall, account.mark_cpu = t0, c0  # a call made right away reuses this reading
        outcome = None
        try:
            return original(self, possibly_batched_index)
        except StopIteration:
            outcome = "StopIteration"
            raise
        except BaseException as exc:
            outcome = f"{type(exc).__name__}: {exc}"
            emit_worker_error(ctx[0], ctx[1], ctx[2], exc)
            raise
        finally:
            t1, c1 = _perf(), _cpu()
            stacks.fetch_ended()
            if account is not None:
                calls.end_fetch()
                by_node, by_name = account.by_node, account.by_name
                _next_timed_seq[ctx] = seq + calls.timing_interval(account, t1 - t0)
            else:
                by_node = by_name = {}
            requests = http_requests.end_batch()
            rq1, pf1 = read_runqueue_wait_ns(), read_minor_faults()
            others1 = -1 if others0 < 0 else (step_threads.others_cpu_ns() if in_process
                                               else http_requests.loader_threads_cpu_ns())
            try:
                items = len(possibly_batched_index)
            except TypeError:  # one index: an iterable dataset, or batch_size=None
                items = 1
            events.emit("fetch", ctx[0], ctx[1], ctx[2], seq, t0, t1, c1 - c0,
                        rq1 - rq0 if rq0 >= 0 and rq1 >= 0 else -1, items, by_node, by_name, outcome, timed,
                        pf1 - pf0 if pf0 >= 0 and pf1 >= 0 else -1, others1 - others0 if others1 >= 0 else -1,
                        requests)
            if ctx is worker_context and t1 - _last_written[0] > WORKER_WRITE_EVERY_NS:
                # Written out as it goes, the sampled stacks too: a worker can end without running any Python
                # (persistent workers are terminated by multiprocessing at the job's exit, and torch's own SIGTERM
                # handler in the worker exits at once), and what it still held was lost: the last batches and
                # every hotspot of a short run. About 20 us a write: at most once per WORKER_WRITE_EVERY_NS.
                _last_written[0] = t1
                stacks.emit_counts_every(WORKER_STACKS_EVERY_NS, t1)
                events.flush()

    fetch.__stallscope_wrapped__ = True  # type: ignore[attr-defined]
    return fetch

