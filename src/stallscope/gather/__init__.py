"""One report for a job recorded node by node (``stallscope run -- torchrun ...`` on each node), with no manual step.

Where the nodes share the store folder (``--store`` on a shared file system), each node leaves a note of its session
under ``jobs/`` beside the others' and the last to finish merges. Where they share nothing, the sessions travel over
torch.distributed's own TCPStore at the job's own address (``MASTER_ADDR:MASTER_PORT``, which every node of the job
could reach): once the job has let that port go, the node that owns the address hosts a TCPStore there and the
others hand it their sessions; it merges. A node that sent nothing before the wait ends is named in the merged
report. ``stallscope merge`` stays for files gathered by hand.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path

from stallscope import paths
from stallscope.gather.parts import Gathered, job_folder, part_of, peers_in_folder, shared_folder
from stallscope.job_names import torchrun_options
from stallscope.session import Session

#: How long a node waits for the others' sessions by default: their launchers end together (torchrun's agents leave
#: through one exit barrier), so this only runs out when a node died or cannot reach the address.
DEFAULT_WAIT_S = 120.0
#: At most this long after a job that failed (a node died, or lost its peer): the surviving nodes' launchers end
#: within seconds of each other, and a dead node sends nothing however long the others wait.
FAILED_JOB_WAIT_S = 30.0
#: How long the first node to finish looks for another node's note in the store folder before it takes the folder
#: to be its own and turns to the network.
SHARED_FOLDER_GRACE_S = 5.0


def one_node_launch(command: list[str]) -> bool:
    """The command is torchrun on one node (``--standalone``, ``--nnodes 1``): a rank missing from its session was
    not recorded (a process Python started with -I, say), not on another node, so there is nothing to wait for."""
    options = torchrun_options(command or [])
    if options is None:
        return False
    words = [w for arg in options for w in arg.split("=", 1)]
    if "--standalone" in words:
        return True
    if "--nnodes" in words and words.index("--nnodes") + 1 < len(words):
        return words[words.index("--nnodes") + 1] in ("1", "1:1")
    return False


def gather(session: Session, session_path: Path, store: Path, *, wait_s: float = DEFAULT_WAIT_S,
           say: Callable[[str], None] = lambda line: None, clock: Callable[[], float] = time.monotonic,
           grace_s: float = SHARED_FOLDER_GRACE_S) -> Gathered | None:
    """Gather this node's job: None where the session holds the whole job (nothing to gather)."""
    part = part_of(session, session_path, store)
    if part is None or one_node_launch(session.command):
        return None
    if not part.job:
        return Gathered([f"this node's session holds rank(s) {list(part.ranks)} of the job's {part.world}, but the "
                         "launcher named no job to gather them by: merge the nodes' sessions with stallscope merge"])
    if session.ended_by == "interrupt":  # Ctrl-C, or a scheduler's SIGTERM: no wait after it
        return Gathered([f"the job was stopped here ({session.ended_by}): this node's session is not gathered; the "
                         "others name its ranks as having sent nothing, or merge the nodes' sessions with "
                         "stallscope merge"])
    if session.exit_code != 0:
        wait_s = min(wait_s, FAILED_JOB_WAIT_S)
    folder = job_folder(store, part.job)
    paths.write_file(folder / f"{part.run_id}.part.json", json.dumps(dataclasses.asdict(part)))
    start = clock()
    while True:  # a shared folder shows another node's note once it has one
        peers = peers_in_folder(folder, part)
        if peers:
            return shared_folder(store, folder, [part, *peers])
        if clock() - start >= grace_s:
            break
        time.sleep(0.5)
    if part.address is None:
        return Gathered([f"no other node of the job left a note in {folder}, and the job's ranks had no "
                         "MASTER_ADDR to meet at: merge the nodes' sessions with stallscope merge"])
    from stallscope.gather.network import exchange  # torch's TCPStore: only for a job that has ranks elsewhere

    return exchange(part, session_path, store, folder, wait_s=wait_s, say=say, clock=clock)
