"""A small DDP training job on CPU (gloo), started by torchrun or by itself with ``--spawn N``.

Switches plant the multi-rank situations stallscope must diagnose: one rank with a slow dataset,
a rank that crashes, explicit barriers. ``--losses PATH`` writes every rank's losses (to check the
recorder changes nothing), and each rank prints its median step time (for the overhead benchmark).
"""

import argparse
import json
import os
import resource
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class Points(Dataset):
    def __init__(self, n, sleep_ms):
        self.n, self.sleep = n, sleep_ms / 1000.0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.sleep:
            time.sleep(self.sleep)
        g = torch.Generator().manual_seed(i)
        x = torch.randn(32, generator=g)
        return x, int(x.sum() > 0)


class TwoHeads(torch.nn.Module):
    """A dynamic graph: the last parameters (``extra``) get a gradient on even steps only."""

    def __init__(self, hidden):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(32, hidden), torch.nn.ReLU())
        self.head = torch.nn.Linear(hidden, 2)
        self.extra = torch.nn.Linear(hidden, 2)

    def forward(self, x, use_extra=True):
        h = self.body(x)
        return self.head(h) + self.extra(h) if use_extra else self.head(h)


def train(rank, world, args):
    torch.set_num_threads(1)
    if args.spawn:
        dist.init_process_group("gloo", rank=rank, world_size=world)
    elif args.slurm:  # one srun task per rank, as many Slurm scripts do: no torchrun, no MASTER_* variables
        rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
        dist.init_process_group("gloo", init_method=f"tcp://{args.slurm}", rank=rank, world_size=world)
    else:
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    if args.images:  # the reference workload (JPEGs decoded and augmented in workers, a small CNN), per rank
        from torchvision import datasets

        from stallscope.demo.reference_train import build_model, build_transform

        data = datasets.ImageFolder(args.images, build_transform(args.image_size, heavy=False))
        model = DistributedDataParallel(build_model("small", len(data.classes)))
    elif args.dynamic:
        model = DistributedDataParallel(TwoHeads(args.hidden), find_unused_parameters=True)
    else:
        layers = [torch.nn.Linear(32, args.hidden), torch.nn.ReLU()]
        for _ in range(args.layers - 2):
            layers += [torch.nn.Linear(args.hidden, args.hidden), torch.nn.ReLU()]
        model = DistributedDataParallel(torch.nn.Sequential(*layers, torch.nn.Linear(args.hidden, 2)),
                                        bucket_cap_mb=args.bucket_mb)
    if args.reducer_waits:
        model._set_ddp_runtime_logging_sample_rate(1)  # DDP's own timer, every step (computes nothing)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sleep = args.slow_ms if rank == args.slow_rank else args.sleep_ms
    if not args.images:
        data = Points(args.samples, sleep)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=False, drop_last=True)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler, num_workers=args.workers)
    try:
        losses, times, waits, cpu, thread_cpu = _epochs(rank, args, model, opt, loader, sampler)
    except SystemExit:
        if args.fail_after_exit:  # cleanup code that fails after a stop (stallscope --steps): exit code 1
            raise RuntimeError("planted failure while stopping") from None
        raise
    if args.losses:
        with open(f"{args.losses}.{rank}", "w") as f:
            json.dump(losses, f)
    if args.reducer_waits:
        with open(f"{args.reducer_waits}.{rank}", "w") as f:
            json.dump(waits, f)
    steady = times[3:] or times
    workers = resource.getrusage(resource.RUSAGE_CHILDREN)  # DataLoader workers, reaped at each epoch's end
    print(f"rank {rank}: {len(times)} steps, median step {1000 * statistics.median(steady):.3f} ms, "
          f"CPU per step {1000 * cpu / len(steady):.3f} ms, training thread {1000 * thread_cpu / len(steady):.3f} ms, "
          f"workers {1000 * (workers.ru_utime + workers.ru_stime) / len(times):.3f} ms", flush=True)
    dist.barrier()
    dist.destroy_process_group()


def _epochs(rank, args, model, opt, loader, sampler):
    losses, times, waits = [], [], []
    backwards = 0
    cpu_start = thread_start = 0.0  # CPU time of the process (gloo's threads included) and of this thread
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        t0 = time.perf_counter()
        for step, (x, y) in enumerate(loader):
            if rank == args.crash_rank and step == args.crash_at:
                raise RuntimeError(f"planted crash on rank {rank} at step {step}")
            for _ in range(args.repeat):
                out = model(x, use_extra=step % 2 == 0) if args.dynamic else model(x)
                if args.reducer_waits and backwards:
                    waits.append(_reducer_wait_ns(model))  # DDP logs the previous backward at this forward
                loss = torch.nn.functional.cross_entropy(out, y)
                opt.zero_grad()
                loss.backward()
                backwards += 1
            opt.step()
            if rank == args.slow_rank and args.slow_code_ms:  # per-step metrics on one rank only (a classic)
                _python_metrics(args.slow_code_ms / 1000.0)
            if step == args.late_hook:  # a hook registered after the first forward (rare, but legal)
                from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook

                model.register_comm_hook(None, fp16_compress_hook)
            if args.barrier:
                dist.barrier()
            losses.append(loss.item())
            t1 = time.perf_counter()
            times.append(t1 - t0)
            if len(times) == 3:
                cpu_start, thread_start = time.process_time(), time.thread_time()
            if args.mark and step == 2:  # a test waits for this before it kills a node mid-run
                open(f"{args.mark}.{rank}", "w").close()
            t0 = t1
    return losses, times, waits, time.process_time() - cpu_start, time.thread_time() - thread_start


def _python_metrics(seconds):
    """Pure-Python work for about ``seconds`` of the step's own code (it changes no tensor)."""
    until = time.perf_counter() + seconds
    total = 0
    while time.perf_counter() < until:
        total += sum(i * i for i in range(200))
    return total


def _reducer_wait_ns(model):
    """DDP's own timing of the previous backward: [from its last gradient computed to its reduction done,
    its backward compute (first to last gradient)]."""
    data = model._get_ddp_logging_data()
    return [data["backward_comm_time_end"] - data["backward_compute_time_end"],
            data["backward_compute_time_end"] - data["backward_compute_time_start"]]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--samples", type=int, default=256, help="samples in the dataset (split over ranks)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--images", default=None, metavar="DIR",
                   help="train the reference workload's small CNN on this ImageFolder instead of --samples points")
    p.add_argument("--image-size", type=int, default=96, help="crop size with --images")
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2, help="linear layers (more gradient buckets)")
    p.add_argument("--bucket-mb", type=float, default=25.0, help="DDP's bucket_cap_mb")
    p.add_argument("--dynamic", action="store_true", help="a model whose last layer is used on even steps only")
    p.add_argument("--repeat", type=int, default=1, help="forward/backward passes per step (more compute)")
    p.add_argument("--sleep-ms", type=float, default=0.0, help="per-sample dataset delay on every rank")
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-ms", type=float, default=0.0, help="per-sample dataset delay on --slow-rank")
    p.add_argument("--slow-code-ms", type=float, default=0.0,
                   help="per-step Python work in the step's own code on --slow-rank (metrics on one rank)")
    p.add_argument("--crash-rank", type=int, default=-1)
    p.add_argument("--crash-at", type=int, default=5)
    p.add_argument("--barrier", action="store_true", help="dist.barrier() after every step")
    p.add_argument("--late-hook", type=int, default=-1, help="register an fp16 comm hook after this step")
    p.add_argument("--losses", default=None, help="write each rank's losses to PATH.<rank>")
    p.add_argument("--reducer-waits", default=None,
                   help="write each rank's DDP-timed [gradient wait, backward compute] (ns, all steps but the last) "
                        "to PATH.<rank>")
    p.add_argument("--mark", default=None, help="create PATH.<rank> once the rank has taken 3 steps")
    p.add_argument("--fail-after-exit", action="store_true", help="turn a SystemExit in the loop into an error")
    p.add_argument("--slurm", default=None, metavar="HOST:PORT",
                   help="an srun task: rank and world size from SLURM_PROCID and SLURM_NTASKS, init at tcp://HOST:PORT")
    p.add_argument("--spawn", type=int, default=0, help="start N ranks with torch.multiprocessing.spawn")
    args = p.parse_args()
    if args.spawn:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        if "DDP_PORT" in os.environ:  # the port a test chose wins over one left in the environment
            os.environ["MASTER_PORT"] = os.environ["DDP_PORT"]
        os.environ.setdefault("MASTER_PORT", "29511")
        torch.multiprocessing.spawn(train, args=(args.spawn, args), nprocs=args.spawn)
    else:
        train(-1, -1, args)


if __name__ == "__main__":
    sys.exit(main())
