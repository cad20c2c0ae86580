"""Sets 2 intra-op threads before and after building its loader; prints the threads each process computes on."""

import sys

import torch
from torch.utils.data import DataLoader


def report_worker(_worker_id: int) -> None:
    print(f"worker threads {torch.get_num_threads()}", flush=True)


def main() -> int:
    workers = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    torch.set_num_threads(2)
    loader = DataLoader(list(range(16)), batch_size=2, num_workers=workers, worker_init_fn=report_worker)
    torch.set_num_threads(2)  # after the loader: --set torch_threads holds all the same
    for _batch in loader:
        pass
    print(f"training threads {torch.get_num_threads()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
