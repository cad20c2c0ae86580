"""One-process DDP (gloo, world size 1) under the recorder's DDP patch, without ``stallscope run``:
prints the ``ddp_wait`` records of a known sequence of backward passes as JSON.

Sequence: 2 synchronised steps, 2 accumulation steps inside ``no_sync()``, 1 synchronised step, a
backward through a plain (non-DDP) model, then 1 synchronised step through ``torch.autograd.backward``.
"""

import json
import sys
import tempfile

from stallscope.collect import read_event_files
from stallscope.recorder import distributed, events

run_dir = tempfile.mkdtemp()
events.configure(run_dir)

import torch  # noqa: E402  (after configure: the patch is applied explicitly below)
import torch.distributed as dist  # noqa: E402
import torch.nn.parallel.distributed as ddp_module  # noqa: E402

distributed.patch_ddp(ddp_module)
dist.init_process_group("gloo", init_method=f"file://{tempfile.mkdtemp()}/store", rank=0, world_size=1)
torch.manual_seed(0)
model = ddp_module.DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                                               torch.nn.Linear(16, 1)))
plain = torch.nn.Linear(8, 1)
x = torch.randn(4, 8)
labels = []


def step(label, backward=lambda loss: loss.backward()):
    labels.append(label)
    backward(model(x).square().mean())


step("sync-1")
step("sync-2")
with model.no_sync():
    step("accumulate-1")
    step("accumulate-2")
step("sync-3")
labels.append("plain-model")
plain(x).sum().backward()
step("sync-4", lambda loss: torch.autograd.backward([loss]))
dist.destroy_process_group()
events.flush()
records = [r for _, recs in read_event_files(__import__("pathlib").Path(run_dir) / "events") for r in recs
           if r[0] == "ddp_wait"]
json.dump({"labels": labels, "waits": [r[1:] for r in records]}, sys.stdout)
