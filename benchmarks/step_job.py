"""A training loop for the step benchmarks: a model of a chosen kind, sized to a chosen step time on this machine.

--model mlp|cnn|slow_layer   a small MLP, a small conv net, or an MLP with a Python loop in one layer's forward
--step-ms MS                 widen the model until a step takes about MS on this machine (measured before the run)
--report-throughput          print "throughput N images/s" over the steps after the third (benchmarks/overhead.py)
--profile OUT                profile steps 10-29 with torch.profiler, each part of the step in a record_function
                             range, and write the profiler's totals and the window's perf_counter_ns bounds to OUT
                             (benchmarks/step_split.py compares them with stallscope's split of the same steps)
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function
from torch.utils.data import DataLoader, TensorDataset

PROFILED = range(10, 30)
PARTS = ("data", "forward", "step_code", "backward", "optimizer")


class SlowGate(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.inner = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            gates = [float(sum(abs(v) for v in row.tolist()) > 1.0) for row in x]
        return self.inner(x) * torch.tensor(gates).unsqueeze(1)


def build(kind: str, width: int) -> tuple[nn.Module, tuple[int, ...]]:
    if kind == "cnn":
        channels = max(4, width // 8)
        model = nn.Sequential(nn.Conv2d(3, channels, 3, padding=1), nn.ReLU(), nn.Conv2d(channels, channels, 3),
                              nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, 10))
        return model, (3, 32, 32)
    layers: list[nn.Module] = [nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU()]
    if kind == "slow_layer":
        layers.append(SlowGate(width))
    layers.append(nn.Linear(width, 10))
    return nn.Sequential(*layers), (64,)


def one_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
             loss_fn: nn.Module, ranged: bool) -> None:
    def part(name: str):
        return record_function(name) if ranged else _Nothing()

    with part("forward"):
        logits = model(x)
    with part("step_code"):
        loss = loss_fn(logits, y)
    with part("backward"):
        loss.backward()
    with part("optimizer"):
        opt.step()
    with part("step_code"):
        opt.zero_grad()
        loss.item()


class _Nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def sized_width(kind: str, step_ms: float, batch: int) -> int:
    """The width at which one step takes about ``step_ms`` here on one thread, as the job runs (growing by 1.4x,
    then the nearer of the last two on a log scale)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        width, previous = 16, None
        while True:
            model, shape = build(kind, width)
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            x, y = torch.randn(batch, *shape), torch.randint(0, 10, (batch,))
            for _ in range(3):
                one_step(model, opt, x, y, nn.CrossEntropyLoss(), False)
            t0 = time.perf_counter()
            for _ in range(10):
                one_step(model, opt, x, y, nn.CrossEntropyLoss(), False)
            took = (time.perf_counter() - t0) / 10 * 1e3
            if took >= step_ms or width >= 8192:
                if previous is not None and previous[1] * took < step_ms * step_ms:  # the smaller one is nearer
                    return previous[0]
                return width
            previous = (width, took)
            width = max(width + 16, 16 * round(width * 1.4 / 16))  # a step costs the width squared: 2x a round
    finally:
        torch.set_num_threads(threads)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=["mlp", "cnn", "slow_layer"], default="mlp")
    p.add_argument("--step-ms", type=float, default=5.0)
    p.add_argument("--width", type=int, default=0, help="the model's width (0: sized to --step-ms)")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--report-throughput", action="store_true")
    p.add_argument("--profile", default=None)
    args = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    width = args.width or sized_width(args.model, args.step_ms, args.batch_size)
    model, shape = build(args.model, width)
    n = args.steps * args.batch_size
    loader = DataLoader(TensorDataset(torch.randn(n, *shape), torch.randint(0, 10, (n,))), batch_size=args.batch_size)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    prof = profile(activities=[ProfilerActivity.CPU]) if args.profile else None
    window = [0, 0]
    started = 0.0
    batches = iter(loader)
    for step in range(args.steps):
        if step == 3:
            started = time.perf_counter()
        if prof is not None and step == PROFILED.start:
            prof.__enter__()
            window[0] = time.perf_counter_ns()
        ranged = prof is not None and step in PROFILED
        with record_function("data") if ranged else _Nothing():
            x, y = next(batches)
        one_step(model, opt, x, y, loss_fn, ranged)
        if prof is not None and step == PROFILED.stop - 1:
            window[1] = time.perf_counter_ns()
            prof.__exit__(None, None, None)
    if args.report_throughput and args.steps > 3:
        print(f"throughput {(args.steps - 3) * args.batch_size / (time.perf_counter() - started):.1f} images/s")
    if prof is not None:
        totals = dict.fromkeys(PARTS, 0.0)
        for event in prof.events():
            if event.name in totals:
                totals[event.name] += event.time_range.elapsed_us() / 1e6
        with open(args.profile, "w") as f:
            json.dump({"window_ns": window, "seconds": totals, "width": width}, f)


if __name__ == "__main__":
    main()
