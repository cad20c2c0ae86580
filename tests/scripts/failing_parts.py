"""A job that fails in one chosen part of its DataLoader or of the script: the failure must be placed where it
happened (the worker and the line of the user's code), said in one line.

usage: failing_parts.py PART CONTEXT, PART one of worker_init, getitem, collate, exit_message; CONTEXT a
multiprocessing start method (fork, spawn, forkserver)."""

import sys

import torch
from torch.utils.data import DataLoader, Dataset


class Samples(Dataset):
    def __init__(self, part: str) -> None:
        self.part = part

    def __len__(self) -> int:
        return 32

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.part == "getitem" and index == 5:
            raise ValueError("sample 5 is damaged")  # the getitem failure
        return torch.zeros(4)


def open_shards(worker_id: int) -> None:
    raise RuntimeError("cannot open the shard list")  # the worker_init failure


def stack_labels(items: list[torch.Tensor]) -> torch.Tensor:
    raise KeyError("no label")  # the collate failure


def main() -> None:
    part, context = sys.argv[1], sys.argv[2]
    if part == "exit_message":
        sys.exit("fatal: bad config")  # the exit message
    loader = DataLoader(Samples(part), batch_size=4, num_workers=2, multiprocessing_context=context,
                        worker_init_fn=open_shards if part == "worker_init" else None,
                        collate_fn=stack_labels if part == "collate" else None)
    for batch in loader:
        batch.sum()


if __name__ == "__main__":
    main()
