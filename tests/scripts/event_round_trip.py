"""Exercises every emitter the recorder has on the CPU, for the event round-trip test (run under the recorder).

Writes, through the real patches: loader, iter, next, stop, shutdown, send, fetch, worker_start, batch_info, pin
(pin_memory needs no GPU to be called), opt, step_limit is not reached; rank, pg_init and coll through a
one-process gloo group; lmdb_open when lmdb is installed; then an uncaught exception."""

import os
import sys
import tempfile

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    data = TensorDataset(torch.arange(32, dtype=torch.float32).view(16, 2), torch.arange(16))
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for workers in (0, 1):
        for x, y in DataLoader(data, batch_size=4, num_workers=workers):
            loss = model(x).sum()
            loss.backward()
            opt.step()
            opt.zero_grad()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
    dist.init_process_group("gloo", rank=0, world_size=1)
    dist.all_reduce(torch.ones(1))
    dist.destroy_process_group()
    try:
        import lmdb

        lmdb.open(tempfile.mkdtemp(), map_size=1 << 20).close()
    except ImportError:
        pass
    raise ValueError("planted at the end")


if __name__ == "__main__":
    main()
