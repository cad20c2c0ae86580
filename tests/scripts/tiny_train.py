"""A small, fast training script with switches for every DataLoader shape the recorder must handle."""

import argparse
import sys
import time

import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, IterableDataset, SequentialSampler


class Squares(Dataset):
    def __init__(self, n, sleep_ms, crash_at=None):
        self.n, self.sleep, self.crash_at = n, sleep_ms / 1000.0, crash_at

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.crash_at is not None and i == self.crash_at:
            raise ValueError(f"planted dataset failure at index {i}")
        if self.sleep:
            time.sleep(self.sleep)
        g = torch.Generator().manual_seed(i)
        return torch.randn(16, generator=g), i % 4


class Stream(IterableDataset):
    def __init__(self, n, sleep_ms):
        self.base = Squares(n, sleep_ms)

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        start, step = (info.id, info.num_workers) if info else (0, 1)
        for i in range(start, len(self.base), step):
            yield self.base[i]


class Batch:
    """A custom batch type without pin_memory(): pinning cannot see inside it."""
    def __init__(self, items):
        self.x = torch.stack([x for x, _ in items])
        self.y = torch.tensor([y for _, y in items])


def custom_collate(items):
    return {"x": torch.stack([x for x, _ in items]), "y": torch.tensor([y for _, y in items])}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=96)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--ctx", default=None)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--sleep-ms", type=float, default=0.0)
    p.add_argument("--iterable", action="store_true")
    p.add_argument("--batch-sampler", action="store_true")
    p.add_argument("--collate", choices=["default", "dict", "class"], default="default")
    p.add_argument("--persistent", action="store_true")
    p.add_argument("--pin", action="store_true")
    p.add_argument("--no-optimizer", action="store_true")
    p.add_argument("--val", action="store_true")
    p.add_argument("--crash-main-at", type=int, default=None)
    p.add_argument("--crash-worker-at", type=int, default=None)
    p.add_argument("--exit-code", type=int, default=0)
    p.add_argument("--forever", action="store_true")
    p.add_argument("--print-loss", action="store_true")
    a = p.parse_args()

    torch.manual_seed(0)
    data = Stream(a.n, a.sleep_ms) if a.iterable else Squares(a.n, a.sleep_ms, a.crash_worker_at)
    kwargs = {"num_workers": a.workers}
    if a.workers:
        kwargs.update(multiprocessing_context=a.ctx, persistent_workers=a.persistent)
    if a.batch_sampler:
        kwargs["batch_sampler"] = BatchSampler(SequentialSampler(data), a.batch_size, drop_last=False)
    else:
        kwargs["batch_size"] = a.batch_size
    if a.collate == "dict":
        kwargs["collate_fn"] = custom_collate
    elif a.collate == "class":
        kwargs["collate_fn"] = Batch
    kwargs["pin_memory"] = a.pin
    loader = DataLoader(data, **kwargs)
    val_loader = DataLoader(Squares(32, 0), batch_size=8) if a.val else None

    model = torch.nn.Linear(16, 4)
    opt = None if a.no_optimizer else torch.optim.SGD(model.parameters(), lr=0.1)
    step = 0
    epoch = 0
    while epoch < a.epochs or a.forever:
        for batch in loader:
            if isinstance(batch, dict):
                x, y = batch["x"], batch["y"]
            elif isinstance(batch, Batch):
                x, y = batch.x, batch.y
            else:
                x, y = batch
            if a.crash_main_at is not None and step == a.crash_main_at:
                raise RuntimeError(f"planted main failure at step {step}")
            if opt is None:
                with torch.no_grad():
                    model(x)
            else:
                loss = torch.nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                if a.print_loss:
                    print(f"loss {loss.item():.10f}", flush=True)
            step += 1
        if val_loader is not None:
            with torch.no_grad():
                for x, y in val_loader:
                    model(x)
        epoch += 1
    print(f"done {step} steps", flush=True)
    sys.exit(a.exit_code)


if __name__ == "__main__":
    main()
