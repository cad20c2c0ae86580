"""A training loop with one planted cost inside the step, for the compute split (forward, backward, optimizer, the
script's own step code) and its lines.

--plant metric_loop      a per-step metric computed element by element in Python (the step's own code)
--plant slow_layer       a custom layer whose forward loops in Python over its rows (forward)
--plant heavy_optimizer  thousands of tiny parameters under a per-parameter Adam (optimizer)
--plant logger_thread    a metrics-exporter thread formatting a large dict in Python, half of every 40 ms
--plant none             a plain small MLP
--accumulate K           gradient accumulation over K batches per optimizer step
--gan                    two models and two optimizers stepped on each batch
--compile                the model under torch.compile
--ddp-find-unused        a one-process gloo DDP with find_unused_parameters=True over a deep model (--depth)
--folds K                K models one after another, each built and trained afresh (cross-validation)
--warm-up-pass           train a throwaway model a few steps on random tensors first (no DataLoader)
--losses PATH            write every loss (as float.hex) to PATH, to compare runs bit for bit
"""

import argparse
import json
import threading
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class SlowLayer(nn.Module):
    """A gate computed row by row in Python from the detached input: the forward costs what its loop costs, the
    backward no more than a linear layer's."""

    def __init__(self, width):
        super().__init__()
        self.inner = nn.Linear(width, width)

    def forward(self, x):
        with torch.no_grad():
            gates = [float(sum(abs(v) for v in row.tolist() * 4) > 1.0) for row in x]  # planted: slow_layer
        return self.inner(x) * torch.tensor(gates).unsqueeze(1)


class ManySmall(nn.Module):
    """Thousands of 4-element parameters: a per-parameter optimizer walks them one by one."""

    def __init__(self, width, count):
        super().__init__()
        self.scales = nn.ParameterList(nn.Parameter(torch.ones(4)) for _ in range(count))
        self.head = nn.Linear(width, width)

    def forward(self, x):
        return self.head(x) * torch.stack(list(self.scales)).mean()


def python_accuracy(logits, target):
    """A metric computed element by element in Python, every step."""
    correct, spread = 0, 0.0
    for row, label in zip(logits.tolist(), target.tolist()):
        best = max(range(len(row)), key=row.__getitem__)
        correct += int(best == label)
        spread += sum((v - row[best]) ** 2 for v in row for _ in range(8))  # planted: metric_loop
    return correct / max(1, len(target)) + 0.0 * spread


def export_metrics(stop):
    """A metrics exporter in a thread: 20 ms of Python formatting, then 20 ms asleep, until told to stop."""
    metrics = {f"layer{i}.grad_norm": i * 0.5 for i in range(3000)}
    while not stop.is_set():
        until = time.perf_counter() + 0.02
        while time.perf_counter() < until:
            json.dumps({k: round(v, 3) for k, v in metrics.items()})  # planted: logger_thread
        stop.wait(0.02)


def build_model(plant, width, classes, depth=1):
    layers = [nn.Linear(width, width), nn.ReLU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), nn.ReLU()]
    if plant == "slow_layer":
        layers.append(SlowLayer(width))
    if plant == "heavy_optimizer":
        layers.append(ManySmall(width, 400))
    layers.append(nn.Linear(width, classes))
    return nn.Sequential(*layers)


def one_process_ddp(model):
    """DDP over a gloo group of one process, searching for unused parameters though there are none."""
    import os
    import socket

    import torch.distributed as dist

    if not dist.is_initialized():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=0, world_size=1)
    return nn.parallel.DistributedDataParallel(model, find_unused_parameters=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--plant", choices=["none", "metric_loop", "slow_layer", "heavy_optimizer", "logger_thread"], default="none")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--accumulate", type=int, default=1)
    p.add_argument("--gan", action="store_true")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--losses", default=None)
    p.add_argument("--folds", type=int, default=1)
    p.add_argument("--ddp-find-unused", action="store_true")
    p.add_argument("--depth", type=int, default=1)
    p.add_argument("--optimizer-kernel", choices=["default", "foreach", "fused"], default="default")
    p.add_argument("--warm-up-pass", action="store_true")
    args = p.parse_args()
    losses = []
    if args.warm_up_pass:
        torch.manual_seed(1)
        probe = build_model("none", args.width, 10)
        probe_opt = torch.optim.SGD(probe.parameters(), lr=0.1)
        for _ in range(5):
            probe(torch.randn(8, args.width)).sum().backward()
            probe_opt.step()
    stop = threading.Event()
    if args.plant == "logger_thread":
        threading.Thread(target=export_metrics, args=(stop,), name="metrics-exporter", daemon=True).start()
    for fold in range(args.folds):
        losses += train(args, fold)
    stop.set()
    if args.losses:
        with open(args.losses, "w") as f:
            f.write("\n".join(float(v).hex() for v in losses) + "\n")


def train(args, fold):
    """One model trained from its own seed; the losses of its steps."""
    torch.manual_seed(fold)
    torch.set_num_threads(1)
    classes = 10
    n = args.steps * args.accumulate * args.batch_size
    data = TensorDataset(torch.randn(n, args.width), torch.randint(0, classes, (n,)))
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=False)
    model = build_model(args.plant, args.width, classes, args.depth)
    if args.ddp_find_unused:
        model = one_process_ddp(model)
    if args.compile:
        model = torch.compile(model)
    heavy = args.plant == "heavy_optimizer"
    kernel = {"default": {"foreach": False} if heavy else {}, "foreach": {"foreach": True},
              "fused": {"fused": True}}[args.optimizer_kernel]
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, **kernel)
    loss_fn = nn.CrossEntropyLoss()
    if args.gan:
        critic = nn.Sequential(nn.Linear(classes, 32), nn.ReLU(), nn.Linear(32, 1))
        critic_opt = torch.optim.SGD(critic.parameters(), lr=1e-2)
    losses = []
    for i, (x, y) in enumerate(loader):
        logits = model(x)
        loss = loss_fn(logits, y) / args.accumulate
        if args.gan:
            fake = critic(logits.softmax(-1)).mean()
            loss = loss - 0.01 * fake
        loss.backward()
        if args.plant == "metric_loop":
            losses.append(python_accuracy(logits.detach(), y))
        losses.append(loss.item())
        if (i + 1) % args.accumulate == 0:
            opt.step()  # planted: heavy_optimizer
            opt.zero_grad()
            if args.gan:
                critic_opt.zero_grad()
                real = critic(torch.nn.functional.one_hot(y, classes).float()).mean()
                fake = critic(logits.detach().softmax(-1)).mean()
                (fake - real).backward()
                critic_opt.step()
    return losses


if __name__ == "__main__":
    main()
