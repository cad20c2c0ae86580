"""The reference training script: torchvision ImageFolder, the standard augmentation recipe, a small CNN.

It is an ordinary training script (stallscope does not import it or need it to cooperate) with
options to plant the classic bottlenecks, so that the diagnosis can be checked against a known
answer:

  --workers 0                    data-starved: loading runs in the training process
  --large-images DIR             big JPEGs (pass a folder of them) with few workers: decode-bound
  --storage-latency-ms 20        every file read waits first, like a network file system
  --heavy-transform              expensive augmentations (blur, rotation, colour jitter): transform-bound
  --model big --in-memory        a big model on pre-decoded tensors held in RAM: compute-bound

and, behind flags of their own, the code changes stallscope recommends for it (``stallscope demo`` measures them):

  --cheaper-transforms           the same augmentations by cheaper means
  --uint8-to-device              uint8 batches, normalized on the device (stallscope.data)
  --reduced-size-decode          each JPEG decoded at the size its crop needs (stallscope.data.FastImageFolder)

Run it alone (``python reference_train.py --data DIR``) or under ``stallscope run``.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.utils.data import ConcatDataset, DataLoader, Dataset, IterableDataset
from torchvision import datasets, transforms
from torchvision.datasets.folder import default_loader
from torchvision.transforms import v2

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


class TreeCpu:
    """CPU seconds of this process, its workers and its parent (a launcher's sampler, when there is one).

    Read at every timed step, because workers exit before the loop's end can be read.
    """

    def __init__(self) -> None:
        import psutil  # stallscope's own dependency; only --report-throughput needs it

        me = psutil.Process()
        self._processes = [me, *me.children(recursive=True)]
        parent = me.parent()
        if parent is not None:
            self._processes.append(parent)
        self._last = {p.pid: self._cpu(p) for p in self._processes}
        self.start = sum(v for v in self._last.values() if v is not None)

    @staticmethod
    def _cpu(process: Any) -> float | None:
        try:
            times = process.cpu_times()
        except Exception:  # noqa: BLE001 - a process that exited keeps its last reading
            return None
        return times.user + times.system

    def read(self) -> float:
        for process in self._processes:
            value = self._cpu(process)
            if value is not None:
                self._last[process.pid] = value
        return sum(v for v in self._last.values() if v is not None) - self.start


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="ImageFolder root (class folders of JPEGs)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--max-batches", type=int, default=None, help="stop each epoch after this many batches")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--model", choices=["small", "big"], default="small")
    p.add_argument("--repeat-dataset", type=int, default=1, metavar="N",
                   help="an epoch goes over the folder N times (long epochs from a small folder, for many workers)")
    p.add_argument("--heavy-transform", action="store_true")
    p.add_argument("--storage-latency-ms", type=float, default=0.0)
    p.add_argument("--in-memory", type=int, default=0, metavar="N",
                   help="pre-decode N images into RAM and train on them (no decoding during training)")
    p.add_argument("--iterable", action="store_true", help="feed an IterableDataset instead of a map-style one")
    p.add_argument("--val-batches", type=int, default=0, help="validate on this many batches after each epoch")
    p.add_argument("--persistent-workers", action="store_true")
    p.add_argument("--prefetch-factor", type=int, default=None)
    p.add_argument("--pin-memory", action="store_true")
    p.add_argument("--mp-context", choices=["fork", "spawn", "forkserver"], default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--print-loss", action="store_true", help="print every step's loss (for reproducibility checks)")
    p.add_argument("--crash", choices=["main", "worker"], default=None, help="raise on purpose (tests)")
    p.add_argument("--crash-at", type=int, default=3,
                   help="step (main) or sample count (worker) at which --crash raises")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads in the training process")
    p.add_argument("--device", choices=["cpu", "cuda", "auto"], default="cpu",
                   help="where the model trains (auto: cuda when a GPU is present); batches are copied there "
                   "non-blocking, from pinned memory with --pin-memory")
    p.add_argument("--report-throughput", action="store_true",
                   help="print images/s measured by the script itself, after the first 3 steps, and the CPU "
                   "seconds an image cost this process, its workers and its parent over the same steps")
    p.add_argument("--cheaper-transforms", action="store_true",
                   help="the same augmentations by cheaper means: crop and flip on uint8 tensors "
                   "(torchvision.transforms.v2), Pillow's own Gaussian blur")
    p.add_argument("--uint8-to-device", action="store_true",
                   help="images stay uint8 through the loader (stallscope.data.collate_uint8) and each batch is "
                   "normalized where the model runs (stallscope.data.DeviceNormalizer)")
    p.add_argument("--reduced-size-decode", action="store_true",
                   help="stallscope.data.FastImageFolder: each JPEG decoded at the size its random crop needs (DCT "
                   "scaling), cropped and flipped as it is decoded")
    return p.parse_args(argv)


class SlowLoader:
    """A file loader that waits before reading, like a high-latency network file system.

    A class, not a closure: spawned and forkserver workers receive the dataset pickled, loader included."""

    def __init__(self, latency_s: float) -> None:
        self.latency_s = latency_s

    def __call__(self, path: str) -> Any:
        if self.latency_s:
            time.sleep(self.latency_s)
        return default_loader(path)


class CrashingFolder(datasets.ImageFolder):
    """Fails on the N-th sample this process loads (whatever the shuffle order)."""
    def __init__(self, *args: Any, crash_at: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.crash_at = crash_at
        self.served = 0

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        self.served += 1
        if self.served > self.crash_at:
            raise RuntimeError(f"planted failure while loading sample {index}")
        return super().__getitem__(index)


class InMemory(Dataset):
    """Decoded, resized images held as uint8 tensors: loading costs nothing but a copy (and the normalization, unless
    ``uint8``: then the device normalizes)."""
    def __init__(self, folder: datasets.ImageFolder, n: int, size: int, uint8: bool = False) -> None:
        prep = transforms.Compose([transforms.Resize(size), transforms.CenterCrop(size), transforms.PILToTensor()])
        picks = list(range(min(n, len(folder))))
        self.items = [(prep(folder.loader(folder.samples[i][0])), folder.samples[i][1]) for i in picks]
        self.norm = transforms.Normalize(MEAN, STD)
        self.uint8 = uint8

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        img, label = self.items[i]
        return (img if self.uint8 else self.norm(img.float() / 255.0)), label


class ReducedSizeDecode(Dataset):
    """The fast data path's folder (``--reduced-size-decode``): ``stallscope.data.FastImageFolder`` decodes each JPEG
    at the size its random crop needs and crops and flips it as it decodes; ``rest`` is the recipe after that, on its
    uint8 image. A read waits ``latency_s`` first, as ``SlowLoader``'s do."""
    def __init__(self, root: str, size: int, rest: Callable[[Any], Any], latency_s: float) -> None:
        from stallscope.data import FastImageFolder, RandomResizedCrop

        self.folder = FastImageFolder(root, crop=RandomResizedCrop(size))
        self.rest, self.latency_s = rest, latency_s

    def __len__(self) -> int:
        return len(self.folder)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        if self.latency_s:
            time.sleep(self.latency_s)
        image, label = self.folder[i]
        return self.rest(image), label


class PillowBlur:
    """A Gaussian blur of random sigma by Pillow's own filter: torchvision's, on a PIL image, turns it into a float
    tensor and back around a convolution."""
    def __init__(self, sigma: tuple[float, float]) -> None:
        self.sigma = sigma

    def __call__(self, image: Any) -> Any:
        from PIL import ImageFilter

        return image.filter(ImageFilter.GaussianBlur(random.uniform(*self.sigma)))


class Streamed(IterableDataset):
    """The same samples as an iterable stream, sharded over workers."""
    def __init__(self, base: Dataset, seed: int) -> None:
        self.base, self.seed = base, seed

    def __iter__(self) -> Iterator[Any]:
        info = torch.utils.data.get_worker_info()
        order = list(range(len(self.base)))  # type: ignore[arg-type]  # map-style: every dataset here has a length
        random.Random(self.seed).shuffle(order)
        if info is not None:
            order = order[info.id::info.num_workers]
        for i in order:
            yield self.base[i]


def build_model(kind: str, classes: int) -> nn.Module:
    if kind == "small":
        return nn.Sequential(
            nn.Conv2d(3, 16, 5, stride=4, padding=2), nn.ReLU(), nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, classes))
    layers, ch = [], 3
    for width in (64, 128, 128, 256, 256):
        layers += [nn.Conv2d(ch, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
                   nn.Conv2d(width, width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
        ch = width
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(ch, classes))


def build_transform(size: int, heavy: bool, cheaper: bool = False, uint8: bool = False,
                    cropped: bool = False) -> Callable[[Any], Any]:
    """The augmentation recipe. ``cheaper``: the same augmentations by cheaper means (the crop and flip on a uint8
    tensor rather than a PIL image, Pillow's own blur). ``uint8``: the image stays uint8, normalized on the device
    after collate. ``cropped``: the images come cropped and flipped already, as uint8 tensors (ReducedSizeDecode)."""
    if cropped:
        steps, tensor = [], True
    elif cheaper:
        steps, tensor = [v2.PILToTensor(), v2.RandomResizedCrop(size, antialias=True), v2.RandomHorizontalFlip()], True
    else:
        steps, tensor = [transforms.RandomResizedCrop(size), transforms.RandomHorizontalFlip()], False
    if heavy:
        if tensor:
            steps.append(v2.ToPILImage())
            tensor = False
        steps += [transforms.ColorJitter(0.4, 0.4, 0.4, 0.1), transforms.RandomRotation(15),
                  PillowBlur((1.0, 3.0)) if cheaper else transforms.GaussianBlur(9, sigma=(1.0, 3.0)),
                  transforms.RandomGrayscale(0.1)]
    if uint8:
        steps += [] if tensor else [transforms.PILToTensor()]
    elif tensor:
        steps += [v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)]
    else:
        steps += [transforms.ToTensor(), transforms.Normalize(MEAN, STD)]
    return transforms.Compose(steps)


def seed_worker(worker_id: int) -> None:
    seed = torch.initial_seed() % 2**32
    random.seed(seed)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not os.path.isdir(args.data):
        print(f"reference_train: no such dataset folder: {args.data}", file=sys.stderr)
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print("reference_train: --device cuda, but torch sees no CUDA device (use --device auto to fall back to "
              "the CPU)", file=sys.stderr)
        return 2
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    if args.threads:
        torch.set_num_threads(args.threads)
    transform = build_transform(args.image_size, args.heavy_transform, args.cheaper_transforms, args.uint8_to_device,
                                cropped=args.reduced_size_decode)
    loader_fn = SlowLoader(args.storage_latency_ms / 1000.0)
    if args.crash == "worker":
        dataset: Dataset = CrashingFolder(args.data, transform=transform, loader=loader_fn, crash_at=args.crash_at)
    elif args.reduced_size_decode:
        dataset = ReducedSizeDecode(args.data, args.image_size, transform, loader_fn.latency_s)
    else:
        dataset = datasets.ImageFolder(args.data, transform=transform, loader=loader_fn)
    classes = len(datasets.ImageFolder(args.data).classes)
    if args.in_memory:
        dataset = InMemory(datasets.ImageFolder(args.data), args.in_memory, args.image_size, args.uint8_to_device)
    if args.repeat_dataset > 1:
        dataset = ConcatDataset([dataset] * args.repeat_dataset)
    if args.iterable:
        dataset = Streamed(dataset, args.seed)

    device = torch.device("cuda" if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
                          else "cpu")
    workers = args.workers
    kwargs = {"batch_size": args.batch_size, "num_workers": workers, "pin_memory": args.pin_memory,
              "worker_init_fn": seed_worker, "generator": torch.Generator().manual_seed(args.seed)}
    normalize = None
    if args.uint8_to_device:
        from stallscope.data import DeviceNormalizer, collate_uint8

        kwargs["collate_fn"] = collate_uint8
        normalize = DeviceNormalizer(device, MEAN, STD)
    if not args.iterable:
        kwargs["shuffle"] = True
    if workers > 0:
        kwargs.update(persistent_workers=args.persistent_workers, prefetch_factor=args.prefetch_factor,
                      multiprocessing_context=args.mp_context)
    train_loader = DataLoader(dataset, **kwargs)
    val_loader = None
    if args.val_batches:
        val_set = datasets.ImageFolder(args.data, transform=transforms.Compose([
            transforms.Resize(args.image_size), transforms.CenterCrop(args.image_size), transforms.ToTensor(),
            transforms.Normalize(MEAN, STD)]))
        val_loader = DataLoader(val_set, batch_size=args.batch_size, num_workers=min(workers, 1))

    model = build_model(args.model, classes).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    step = 0
    timed_from, timed_images = None, 0
    tree_cpu: TreeCpu | None = None
    timed_cpu_s = 0.0
    for _epoch in range(args.epochs):
        model.train()
        for batch_index, (images, labels) in enumerate(train_loader):
            if args.crash == "main" and step == args.crash_at:
                raise RuntimeError(f"planted failure in the training loop at step {step}")
            if normalize is not None:
                images, labels = normalize(images, labels)
            elif device.type != "cpu":
                images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
            loss = loss_fn(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if args.print_loss:
                print(f"step {step} loss {loss.item():.8f}", flush=True)
            step += 1
            if step == 3:
                timed_from = time.perf_counter()
                tree_cpu = TreeCpu() if args.report_throughput else None
            elif timed_from is not None:
                timed_images += images.shape[0]
                timed_cpu_s = tree_cpu.read() if tree_cpu is not None else 0.0
            if args.max_batches and batch_index + 1 >= args.max_batches:
                break
        if val_loader is not None:
            model.eval()
            with torch.no_grad():
                for i, (images, _labels) in enumerate(val_loader):
                    model(images.to(device, non_blocking=True))
                    if i + 1 >= args.val_batches:
                        break
    if args.report_throughput and timed_from is not None:
        print(f"throughput {timed_images / (time.perf_counter() - timed_from):.3f} images/s", flush=True)
        if timed_images:
            print(f"cpu per image {1000 * timed_cpu_s / timed_images:.4f} ms", flush=True)
    print(f"trained {step} steps", flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl-C ends the demo's training: the shell's code for it, not a traceback
        sys.exit(130)
