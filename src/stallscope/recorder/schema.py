"""The event records of the per-process event files: each kind and the names of its fields, in order.

The hot path writes a record as a plain tuple ``(kind, field, field, ...)`` (``events.emit``); this
table is what those positions mean. ``collect.py`` reads every record through it, by name, and a test
writes events with the real emitters and reads them back, so an emitter and the collector cannot drift
apart. Times are ``perf_counter_ns`` of the writing process; ``pid`` fields are os pids.
"""

from __future__ import annotations

from typing import Any

EVENT_FIELDS: dict[str, tuple[str, ...]] = {
    # process life
    "role": ("role",),
    "process_start": ("t_ns", "argv"),
    "process_exit": ("t_ns", "status"),  # status: only when it left through os._exit
    "signal": ("t_ns", "signal"),
    "exception": ("t_ns", "type", "message", "location", "traceback"),
    "cuda_init": ("t_ns", "device"),
    # DataLoader, in the training process
    "loader": ("loader_id", "created_ns", "site", "config", "overrides", "stack"),
    "iter": ("loader_id", "iter_id", "epoch", "start_ns", "end_ns", "num_workers"),
    "next": ("loader_id", "iter_id", "epoch", "start_ns", "end_ns", "worker", "batch_size", "unpickle_ns",
             "unpickle_cpu_ns"),
    "stop": ("loader_id", "iter_id", "epoch", "start_ns", "end_ns"),
    "shutdown": ("loader_id", "iter_id", "start_ns", "end_ns", "num_workers"),
    "next_stall": ("loader_id", "iter_id", "epoch", "start_ns", "end_ns", "how", "message", "pending", "awaited",
                   "dead"),
    "send": ("loader_id", "iter_id", "epoch", "send_idx", "worker", "t_ns"),
    "batch_info": ("loader_id", "iter_id", "info"),
    # a batch's tensor bytes, once a second at most (what the over-time figures see of data that changes size)
    "batch_bytes": ("loader_id", "t_ns", "nbytes"),
    "pin": ("main_thread", "start_ns", "end_ns"),
    "step_limit": ("max_steps", "done", "t_ns"),
    # DataLoader workers (and the training process for num_workers=0)
    "worker_start": ("loader_id", "iter_id", "worker", "pid", "created_ns", "entered_ns", "ready_ns", "threads"),
    "fetch": ("loader_id", "iter_id", "worker", "seq", "start_ns", "end_ns", "cpu_ns", "runqueue_ns", "items",
              "by_node", "by_name", "outcome", "timed", "minflt", "threads_cpu_ns",  # -1 unknown; absent in older runs
              "requests"),  # HTTP requests: recorder/http_requests.py's tally, None where none was made
    # an exception in a worker: in a fetch, or in the script's worker_init_fn
    "fetch_error": ("loader_id", "iter_id", "worker", "worker_pid", "t_ns", "type", "message", "traceback"),
    "lmdb_open": ("pid", "t_ns", "path"),
    # a process sent a request over a connection another (its parent, before forking it) opened: once per opener and
    # address in each process (recorder/http_requests.py)
    "shared_connection": ("pid", "t_ns", "opened_by", "address"),
    # samples: [[loader_id, stage, [file:line:function, ...], count], ...]; sampler: "signal" or "thread" (absent
    # before it was recorded); fallback_reason: why the thread sampler ran instead of the signal sampler
    "stack_samples": ("t_ns", "samples", "sampler", "fallback_reason"),
    "stack_sampler_off": ("t_ns", "reason"),
    # the training process's main thread while it computes: [[part, [file:line:function, ...], count], ...]
    "step_samples": ("t_ns", "samples"),
    # training frameworks, in the training process
    # what the machine charges for something the run did not do, measured at exit (recorder/shm_cost.py)
    "calibration": ("t_ns", "kind", "values"),
    "framework_args": ("framework", "t_ns", "site", "values"),
    "tracker_run": ("tracker", "t_ns", "run"),  # run: its id and where it lives (recorder/trackers.py)
    # training steps and devices
    "opt": ("optimizer", "kind", "start_ns", "end_ns"),
    # the step's forward (a root module's outermost call) and backward (autograd.backward or .grad): step_parts.py
    "fwd": ("start_ns", "end_ns", "module"),
    "bwd": ("start_ns", "end_ns", "how"),
    # what the step computes with, once each (recorder/model_facts.py)
    "optimizer_info": ("optimizer", "kind", "t_ns", "info"),
    "model_info": ("t_ns", "info"),
    "ddp_info": ("t_ns", "info"),
    # the training process's other Python threads while its step computes (recorder/step_threads.py), cumulative
    "threads_info": ("t_ns", "info"),
    # the garbage collector's collections in a recorded process so far (recorder/gc_timing.py), cumulative
    "gc": ("t_ns", "collections", "total_ns", "full_collections", "full_ns", "longest_ns"),
    # the CUDA caching allocator's counters at exit (recorder/model_facts.py)
    "allocator_info": ("t_ns", "info"),
    # the profiler window (recorder/op_window.py): ops [[part, name, calls, self CPU ns, self device ns], ...]
    "op_window": ("start_ns", "opened_ns", "stop_ns", "end_ns", "steps", "folded", "ops", "cpu_ns", "device_ns",
                  "syncs"),
    "h2d": ("start_ns", "end_ns", "nbytes", "pinned", "non_blocking", "call"),
    "gpu_span": ("kind", "step", "start_ns", "end_ns", "gpu_ns", "nbytes"),
    "gpu_span_lost": ("count",),
    # torch.distributed
    "rank": ("rank", "local_rank", "world_size", "node_rank", "host", "t_ns", "wall_ns", "job", "store"),
    "pg_init": ("backend", "rank", "world_size", "start_ns", "end_ns", "wall_ns"),
    "coll": ("op", "seq", "group_size", "is_async", "start_ns", "end_ns"),
    "ddp_wait": ("started_ns", "computed_ns", "returned_ns"),
    "ddp": ("bucket", "launched_ns", "done_ns"),  # sessions recorded before ddp_wait; no longer written
}


def fields_of(record: list[Any]) -> tuple[str, dict[str, Any]]:
    """``(kind, {field: value})`` of one record; fields beyond the known ones are dropped, missing
    trailing ones are absent (the reader supplies defaults). An unknown kind has no named fields."""
    kind = record[0]
    names = EVENT_FIELDS.get(kind, ())
    return kind, dict(zip(names, record[1:]))
