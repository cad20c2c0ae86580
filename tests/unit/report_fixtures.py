"""A hand-built session with two workers, system samples and hostile strings, shared by the report tests."""

from __future__ import annotations

from stallscope.constants import SESSION_SCHEMA
from stallscope.session import (
    ErrorRecord,
    FetchRecord,
    IterRecord,
    LoaderRecord,
    NextRecord,
    OptimizerStepRecord,
    ProcessRecord,
    SendRecord,
    Session,
    WorkerStartRecord,
)

MS = 1_000_000
T0 = 1_000_000 * MS  # the run starts here on the monotonic clock
PID = 100
#: A path that would run code if a report put it into markup unescaped.
HOSTILE = "/data/<script>document.body.setAttribute('data-pwned','1')</script>&x"
HOSTILE_MESSAGE = "cannot open it <img src=x onerror=\"document.body.setAttribute('data-pwned','2')\">"
#: A function name that would run code if a chart's text were markup.
HOSTILE_FUNCTION = "<img src=x onerror=\"document.body.setAttribute('data-pwned','3')\">"
WORKER_PIDS = (200, 201)
USER_FILE = f"{HOSTILE}/train.py"
SITE = "/venv/lib/python3.11/site-packages"
#: The sampled stacks of ``two_worker_session(stacks=True)``, innermost frame first, as the recorder writes them:
#: (worker pid, stage, frames, count).
STACKS = [
    (200, "decode", [f"{SITE}/PIL/Image.py:3300:open", f"{USER_FILE}:31:Images.__getitem__",
                     f"{SITE}/torch/utils/data/_utils/fetch.py:54:_MapDatasetFetcher.fetch"], 30),
    (201, "decode", [f"{SITE}/PIL/Image.py:3300:open", f"{USER_FILE}:31:Images.__getitem__",
                     f"{SITE}/torch/utils/data/_utils/fetch.py:54:_MapDatasetFetcher.fetch"], 20),
    (200, "decode", [f"{USER_FILE}:12:{HOSTILE_FUNCTION}", f"{USER_FILE}:33:Images.__getitem__",
                     f"{SITE}/torch/utils/data/_utils/fetch.py:54:_MapDatasetFetcher.fetch"], 25),
    (201, "decode", [f"{USER_FILE}:40:Images.__getitem__.<locals>.<lambda>", f"{USER_FILE}:33:Images.__getitem__",
                     f"{SITE}/torch/utils/data/_utils/fetch.py:54:_MapDatasetFetcher.fetch"], 25),
    (200, "storage", [f"{USER_FILE}:20:read_bytes", f"{USER_FILE}:30:Images.__getitem__"], 8),
]


def two_worker_session(steps: int = 10, step_ms: int = 100, wait_ms: int = 40, samples: bool = True,
                       run_id: str = "20240101-000000-abcdef", stacks: bool = False,
                       sampler: str | None = "signal") -> Session:
    """Steps of ``step_ms`` with ``wait_ms`` of data wait; two workers alternate 80 ms batches. With ``stacks``,
    the workers are processes of the job and their sampled ``STACKS`` are in the session (taken by ``sampler``;
    None: recorded before the sampler was noted)."""
    nexts, opts, fetches, sends = [], [], [], []
    base = T0 + 500 * MS
    for k in range(steps):
        s0 = base + k * step_ms * MS
        nexts.append(NextRecord(0, 0, 0, s0, s0 + wait_ms * MS, k % 2, 4, PID))
        opts.append(OptimizerStepRecord(1, "SGD", s0 + (step_ms - 5) * MS, s0 + step_ms * MS, PID))
        f0 = s0 - 60 * MS
        fetches.append(FetchRecord(0, 0, k % 2, k // 2, f0, f0 + 80 * MS, 50 * MS, 5 * MS, 4,
                                   {"decode": [30 * MS, 30 * MS, 4]}, {"Image.open": [30 * MS, 30 * MS, 4]},
                                   None, 200 + k % 2))
        sends.append(SendRecord(0, 0, 0, k, k % 2, f0 - MS))
    starts = [WorkerStartRecord(0, 0, w, 200 + w, T0 + 300 * MS, T0 + 350 * MS, T0 + 380 * MS, {"torch": 1})
              for w in range(2)]
    ticks = [T0 + i * 100 * MS for i in range(12)]
    sample_block = {
        "schema": "stallscope.samples/1", "interval_s": 0.1, "t_ns": ticks,
        "system": {"cpu_percent": [50.0 + i for i in range(12)]},
        "processes": {str(PID): {"first": 0, "ticks": list(range(12)), "cpu_s": [0.1] * 12,
                                 "rss_bytes": [100 * 2**20] * 12},
                      "200": {"first": 3, "ticks": list(range(3, 12)), "cpu_s": [0.1] * 9,
                              "rss_bytes": [50 * 2**20] * 9}},
        "gpu": None,
    } if samples else {}
    return Session(
        schema=SESSION_SCHEMA, run_id=run_id, command=["python", f"{HOSTILE}/train.py"], cwd=HOSTILE,
        started_wall=1_700_000_000.0, start_ns=T0, end_ns=base + (steps * step_ms + 200) * MS, exit_code=1,
        ended_by="exit", overrides={"num_workers": 2}, max_steps=None, environment={"cpus_affinity": 4},
        processes=[ProcessRecord(PID, 1, "main", [], 0, T0)]
        + ([ProcessRecord(pid, PID, "worker", [], 0, T0) for pid in WORKER_PIDS] if stacks else []),
        stack_samples=[{"pid": pid, "loader_id": 0, "stage": stage, "frames": frames, "count": count,
                        **({"sampler": sampler} if sampler else {})}
                       for pid, stage, frames, count in STACKS] if stacks else [],
        loaders=[LoaderRecord(0, PID, T0 + 200 * MS, f"{HOSTILE}/train.py:10",
                              {"num_workers": 2, "batch_size": 4}, {})],
        iters=[IterRecord(0, 0, 0, T0 + 300 * MS, T0 + 400 * MS, 2, PID)],
        nexts=nexts, sends=sends, fetches=fetches, worker_starts=starts, optimizer_steps=opts,
        errors=[ErrorRecord("main", PID, base + steps * step_ms * MS, "RuntimeError",
                            f"{HOSTILE_MESSAGE} {HOSTILE}", f"{HOSTILE}/train.py:42",
                            "Traceback ...")],
        system_samples=sample_block)
