"""An input-bound training loop (Python work per sample, a tiny model), run plainly or inside
``with stallscope.record():``, for tests/e2e/test_inprocess.py.

    python inprocess_job.py --workers 2 --ctx spawn                         # plain (under stallscope run)
    python inprocess_job.py --workers 2 --ctx spawn --inprocess OUT.json --store DIR
    ... --inprocess OUT.json --raise      # the block raises; OUT.json says what came out of it
    ... --inprocess OUT.json --twice      # two blocks, then training after them that nothing records
"""

import argparse
import json
import os
import sys

import torch
from torch.utils.data import DataLoader, Dataset


class Busy(Dataset):
    """Pure-Python work per sample, so the loader, not the model, limits the loop."""

    def __init__(self, n, work):
        self.n, self.work = n, work

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        acc = 0
        for k in range(self.work):
            acc = (acc + k * i) % 9973
        return torch.full((16,), float(acc % 7)), i % 4


def train(args, samples):
    torch.manual_seed(0)
    kwargs = {"num_workers": args.workers, "batch_size": 8}
    if args.workers:
        kwargs["multiprocessing_context"] = args.ctx
    loader = DataLoader(Busy(samples, args.work), **kwargs)
    model = torch.nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return loss.item()


def recorded(args, samples, label=None):
    import stallscope

    with stallscope.record(store=args.store, label=label) as rec:
        loss = train(args, samples)
    return rec, loss


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--ctx", default="fork")
    p.add_argument("--n", type=int, default=256)
    p.add_argument("--work", type=int, default=40000)
    p.add_argument("--inprocess", metavar="OUT")
    p.add_argument("--store")
    p.add_argument("--raise", dest="raise_", action="store_true")
    p.add_argument("--twice", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(1)  # the workers have the cores; the tiny model needs none of them

    if not args.inprocess:
        print(f"loss {train(args, args.n):.6f}", flush=True)
        return
    import stallscope

    unloaded = argparse.Namespace(**{**vars(args), "workers": 0})
    train(unloaded, 8)  # torch sets a variable or two on first use (TORCHINDUCTOR_CACHE_DIR): not ours to undo
    environ = dict(os.environ)
    out = {}
    if args.raise_:
        planted = ValueError("planted <b>failure</b> & [red]")
        try:
            with stallscope.record(store=args.store) as rec:
                train(args, 64)
                raise planted
        except ValueError as exc:
            out["propagated_same"] = exc is planted and exc.__traceback__ is not None
        out["summary"] = rec.summary()
        out["html"] = rec._repr_html_()
    elif args.twice:
        first, _ = recorded(args, args.n // 2, label="first")
        second, _ = recorded(args, args.n // 4, label="second")
        train(args, args.n // 4)  # after the blocks: recorded nowhere
        out["summaries"] = [first.summary(), second.summary()]
        out["run_dirs_after"] = [sorted(os.listdir(os.path.dirname(r.session_path))) for r in (first, second)]
    else:
        rec, loss = recorded(args, args.n)
        out["summary"] = rec.summary()
        out["loss"] = loss
        out["environ_unchanged"] = dict(os.environ) == environ
        out["plain_loss"] = train(unloaded, args.n)  # unrecorded (and in-process), the same loss
    out["environ_unchanged"] = out.get("environ_unchanged", True) and dict(os.environ) == environ
    with open(args.inprocess, "w") as f:
        json.dump(out, f)
    sys.exit(0)


if __name__ == "__main__":
    main()
