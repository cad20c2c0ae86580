"""Training jobs whose step itself is the cost, for the compute findings on a GPU (``benchmarks/gpu_check.sh``).

--mode launch    batch 1 through a small, deep MLP: thousands of tiny kernels, the host sets the pace (host-bound)
--mode item      a mid-sized MLP whose loss is read back with .item() every step, twice (device-sync)
--mode conv      an fp32 conv net without autocast (mixed-precision, tf32, cudnn-benchmark, channels-last)
--mode conv-amp  the same under bf16 autocast (mixed-precision must not fire)
--mode alloc     a batch size that changes every step (the caching allocator's churn; no finding yet)

Runs on the CPU when no GPU is present (the device findings then stay quiet). ``--losses PATH`` writes every loss as
float.hex, to compare runs bit for bit.
"""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Tensors(Dataset):
    """Samples sliced from tensors made once: the input side costs next to nothing."""

    def __init__(self, n, shape):
        g = torch.Generator().manual_seed(0)
        self.n, self.x = n, torch.randn((1024, *shape), generator=g)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return self.x[i % len(self.x)], i % 10


def mlp(width, depth):
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.GELU()]
    return nn.Sequential(*layers, nn.Linear(width, 10))


def conv_net():
    return nn.Sequential(
        nn.Conv2d(3, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
        nn.Conv2d(64, 128, 3, padding=1, stride=2), nn.BatchNorm2d(128), nn.ReLU(),
        nn.Conv2d(128, 256, 3, padding=1, stride=2), nn.BatchNorm2d(256), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, 10))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["launch", "item", "conv", "conv-amp", "alloc"], required=True)
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--losses", default=None)
    args = p.parse_args()
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.mode == "launch":
        model, shape, batch = mlp(64, 24), (64,), 1
    elif args.mode == "item":
        model, shape, batch = mlp(2048, 8), (2048,), 256
    elif args.mode == "alloc":
        model, shape, batch = mlp(2048, 4), (2048,), 64
    else:
        model, shape, batch = conv_net(), (3, 64, 64), 64
    model = model.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    data = Tensors(args.steps * 128, shape)
    loader = DataLoader(data, batch_size=128 if args.mode == "alloc" else batch, num_workers=2, pin_memory=True,
                        persistent_workers=True)
    losses, total = [], torch.zeros((), device=device)
    for step, (x, y) in enumerate(loader):
        if step >= args.steps:
            break
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        if args.mode == "alloc":  # a different batch size every step: fresh blocks of new sizes
            keep = 16 + (step * 37) % 112
            x, y = x[:keep], y[:keep]
        if args.mode == "conv-amp":
            with torch.autocast(device, dtype=torch.bfloat16):
                loss = loss_fn(model(x), y)
        else:
            loss = loss_fn(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if args.mode == "item":
            losses.append(loss.item())  # planted: item
            if loss.item() > 1e9:  # planted: item
                print("diverged")
        else:
            total += loss.detach()
            losses.append(loss.detach())
    values = [float(v) for v in losses]
    if device == "cuda":
        stats = torch.cuda.memory_stats()
        print(f"allocator: reserved {stats.get('reserved_bytes.all.peak', 0) / 2**20:.0f} MiB peak, allocated "
              f"{stats.get('allocated_bytes.all.peak', 0) / 2**20:.0f} MiB peak, "
              f"{stats.get('num_alloc_retries', 0)} retries, {stats.get('segment.all.allocated', 0)} segments")
    if args.losses:
        with open(args.losses, "w") as f:
            f.write("\n".join(v.hex() for v in values) + "\n")


if __name__ == "__main__":
    main()
