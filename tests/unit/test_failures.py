"""Where a failure is placed and how it is said: the worker and the line of the user's code (not torch's
internals), in one line, whatever the recorded exception looked like."""

from __future__ import annotations

import dataclasses

import pytest

from stallscope.analysis.failures import failure, frames_and_tail, user_location
from stallscope.analysis.findings import Failure
from stallscope.render.words import failures
from stallscope.session import ErrorRecord
from tests.unit.report_fixtures import PID, two_worker_session

TORCH = "/venv/lib/python3.11/site-packages/torch"
OWN = f"{TORCH}/../stallscope/recorder/workers.py"  # not the user's either: stallscope's own frames
#: What torch raises in the training process for a worker_init_fn that raised, as a recorder without the worker's
#: own record kept it (``str(exc)`` and the formatted traceback), from a real run.
WRAPPED_MESSAGE = (
    "Caught RuntimeError in DataLoader worker process 1.\n"
    "Original Traceback (most recent call last):\n"
    f'  File "{TORCH}/utils/data/_utils/worker.py", line 307, in _worker_loop\n'
    "    init_fn(worker_id)\n"
    '  File "/home/me/job/train.py", line 27, in open_shards\n'
    '    raise RuntimeError("cannot open the shard list")\n'
    "RuntimeError: cannot open the shard list\n")
MAIN_TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/home/me/job/train.py", line 42, in <module>\n'
    "    main()\n"
    '  File "/home/me/job/train.py", line 40, in main\n'
    "    for batch in loader:\n"
    f'  File "{TORCH}/utils/data/dataloader.py", line 1569, in _process_data\n'
    "    data.reraise()\n"
    f'  File "{TORCH}/_utils.py", line 803, in reraise\n'
    "    raise exception\n"
    f"RuntimeError: {WRAPPED_MESSAGE}")


def _session(errors, exit_code=1):
    return dataclasses.replace(two_worker_session(), errors=errors, exit_code=exit_code)


def test_a_worker_failure_known_only_from_torchs_message_is_the_workers_at_the_users_line():
    """A session whose worker left no record of its own (recorded before workers kept their worker_init_fn's
    exception, or a worker killed before it wrote it): torch's message says which worker, and what it raised."""
    main = ErrorRecord("main", PID, 5, "RuntimeError", WRAPPED_MESSAGE, f"{TORCH}/_utils.py:803", MAIN_TRACEBACK)
    found = failure(_session([main]))
    assert (found.where, found.worker, found.loader_id, found.type, found.message, found.location) == (
        "worker", 1, 0, "RuntimeError", "cannot open the shard list", "/home/me/job/train.py:27")
    assert failures.failure_place(found) == "worker 1 of loader 0"
    assert failures.failure_detail(found) == "RuntimeError: cannot open the shard list  at /home/me/job/train.py:27"


def test_the_worker_torch_named_is_the_failure_where_several_workers_failed():
    main = ErrorRecord("main", PID, 9, "RuntimeError", WRAPPED_MESSAGE, f"{TORCH}/_utils.py:803", MAIN_TRACEBACK)
    tb = ("Traceback (most recent call last):\n"
          f'  File "{OWN}", line 101, in __call__\n    self.user_fn(worker_id)\n'
          '  File "/home/me/job/train.py", line 27, in open_shards\n    raise RuntimeError("x")\n'
          "RuntimeError: cannot open the shard list\n")
    workers = [ErrorRecord("worker", pid, t, "RuntimeError", "cannot open the shard list", f"{OWN}:101", tb, 0, w)
               for pid, t, w in ((200, 3, 0), (201, 4, 1))]
    found = failure(_session([*workers, main]))
    assert (found.where, found.worker, found.pid, found.location) == ("worker", 1, 201, "/home/me/job/train.py:27")
    assert failures.failure_place(found) == "worker 1 (pid 201) of loader 0"
    assert found.traceback == tb  # kept whole for the HTML report and the summary JSON, not said in the line


def test_a_main_failure_raised_inside_a_library_is_placed_at_the_users_line():
    tb = ("Traceback (most recent call last):\n"
          '  File "/home/me/job/train.py", line 12, in <module>\n    model(x)\n'
          f'  File "{TORCH}/nn/modules/linear.py", line 116, in forward\n    return F.linear(x, w)\n'
          "RuntimeError: mat1 and mat2 shapes cannot be multiplied\n")
    main = ErrorRecord("main", PID, 5, "RuntimeError", "mat1 and mat2 shapes cannot be multiplied",
                       f"{TORCH}/nn/modules/linear.py:116", tb)
    assert failure(_session([main])).location == "/home/me/job/train.py:12"
    # no frame of the user's code at all (a library's own dataset): the recorded innermost frame stays
    lib_only = dataclasses.replace(main, traceback=tb.replace("/home/me/job/train.py", f"{TORCH}/run.py"))
    assert failure(_session([lib_only])).location == f"{TORCH}/nn/modules/linear.py:116"


def test_a_traceback_cut_at_its_start_and_a_chained_one_are_read_from_their_frames():
    cut = '  File "/home/me/job/train.py", line 8, in f\n    f()\n' * 3 + "RecursionError: maximum depth\n"
    assert user_location(cut) == "/home/me/job/train.py:8"
    chained = ("Traceback (most recent call last):\n  File \"/home/me/a.py\", line 1, in <module>\n    x\n"
               "KeyError: 'k'\n\nDuring handling of the above exception, another exception occurred:\n\n"
               "Traceback (most recent call last):\n  File \"/home/me/b.py\", line 2, in <module>\n    y\n"
               "ValueError: v\n")
    frames, tail = frames_and_tail(chained)
    assert (frames, tail) == ([("/home/me/b.py", 2)], "ValueError: v")
    assert user_location(None) is None


@pytest.mark.parametrize("message, said", [
    ("one line", "one line"),
    ("2 validation errors for Config\nlr\n  field required", "2 validation errors for Config … (2 more lines)"),
    ("\n\nfirst said\n", "first said"),
])
def test_a_failure_is_said_in_one_line(message, said):
    f = Failure("main", "ValueError", message, "train.py:3")
    assert failures.failure_detail(f) == f"ValueError: {said}  at train.py:3"


@pytest.mark.parametrize("exit_code, expected", [
    (1, ("exit", "fatal: bad config", "/home/me/job/train.py:37")),
    (0, None),  # the SystemExit was caught: the script went on and ended well
    (3, ("exit", None, None)),  # it went on and exited otherwise: the message was not its end
])
def test_sys_exit_with_a_message_is_the_failure_only_where_it_ended_the_script(exit_code, expected):
    tb = ('Traceback (most recent call last):\n  File "/home/me/job/train.py", line 37, in main\n'
          '    sys.exit("fatal: bad config")\nSystemExit: fatal: bad config')
    exit_record = ErrorRecord("main", PID, 5, "SystemExit", "fatal: bad config", "/home/me/job/train.py:37", tb)
    found = failure(_session([exit_record], exit_code=exit_code))
    assert (found and (found.type, found.message, found.location)) == expected
    if exit_code == 1:
        assert failures.failure_detail(found) == (
            "the script exited with code 1: fatal: bad config  at /home/me/job/train.py:37")
        assert not failures.failure_is_stop(found)


GLOO_LOST = ("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:561] Connection closed by peer "
             "[127.0.0.1]:31907. This is typically caused by a remote worker crashing.")


def test_a_rank_that_lost_its_peer_is_not_the_failure_the_rank_that_crashed_is():
    """torchrun, two ranks: rank 1 raises; rank 0's all-reduce then fails with gloo's 'closed by peer'. The job's
    failure is rank 1's own, though rank 0 is the training process stallscope reports first."""
    from stallscope.session import RankRecord

    other = PID + 1
    ranks = [RankRecord(PID, 0, 0, 2, 0, "a"), RankRecord(other, 1, 1, 2, 0, "a")]
    lost = ErrorRecord("main", PID, 9, "RuntimeError", GLOO_LOST, None, "")
    crash = ErrorRecord("main", other, 7, "RuntimeError", "planted crash on rank 1 at step 6", None, "")
    found = failure(dataclasses.replace(_session([lost, crash]), ranks=ranks))
    assert (found.type, found.message, found.rank, found.cause) == ("RuntimeError", crash.message, 1, None)
    assert failures.failure_place(found) == "rank 1"
    # torchrun ended rank 0 before it recorded its lost connection: the launcher's ChildFailedError is not the failure
    launcher = ErrorRecord("main", PID - 1, 10, "ChildFailedError", "\n=== ddp_train.py FAILED ===", None, "")
    session = dataclasses.replace(_session([launcher, crash]), ranks=ranks)
    assert (failure(session).message, failure(session).rank) == (crash.message, 1)
    # one node's session holds rank 0 only: its error is the consequence of a rank elsewhere, and said so
    alone = failure(dataclasses.replace(_session([lost]), ranks=ranks[:1]))
    assert (alone.cause, alone.rank) == ("peer-lost", 0)
    assert failures.failure_detail(alone).startswith(
        "it lost its connection to another rank of the job, which ended first (that rank's node, its session or its "
        "log, says why; this error is the consequence): RuntimeError: [/pytorch/third_party/gloo")
    # the same words outside a distributed backend's error are the script's own
    own = failure(dataclasses.replace(_session([dataclasses.replace(lost, message="Connection reset by peer")]),
                                      ranks=ranks[:1]))
    assert own.cause is None
