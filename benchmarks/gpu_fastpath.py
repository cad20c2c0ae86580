"""On a GPU: uint8 transfer with device normalization against float32 host normalization, and
nvJPEG against CPU decoding, measured side by side in one run (issue 4, acceptance 6).

1. Decode: each CPU decoder's single-core rate on the demo JPEGs, then nvJPEG through
   ``torchvision.io.decode_jpeg(device="cuda")`` one image at a time and in batches.
2. One batch of 224x224 images, both ways: host ``ToTensor``+``Normalize`` arithmetic (one core)
   plus a pinned float32 copy, against a pinned uint8 copy plus the normalization kernel on the
   device. Copies and kernels are timed with CUDA events.
3. End to end, the same DataLoader workers, batches ending normalized on the GPU:
   (a) torchvision ImageFolder + RandomResizedCrop + flip + ToTensor + Normalize (host float32),
   (b) the same recipe ending in PILToTensor (uint8), normalized on the device,
   (c) stallscope FastImageFolder + collate_uint8 + DeviceNormalizer.

Usage: python benchmarks/gpu_fastpath.py [--files 2000] [--workers N]   (exits 0 with a message without CUDA)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
from torch.utils.data import DataLoader

from stallscope.data import (
    DeviceNormalizer,
    FastImageFolder,
    RandomResizedCrop,
    available_decoders,
    collate_uint8,
    measure_decode_rate,
)
from stallscope.demo.dataset import DatasetSpec, demo_dataset

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def nvjpeg_rate(blobs: list[bytes], batch: int, min_seconds: float = 1.5) -> float:
    from torchvision.io import ImageReadMode, decode_jpeg

    tensors = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in blobs]
    groups = [tensors[i:i + batch] for i in range(0, len(tensors) - batch + 1, batch)]

    def run(group):
        return decode_jpeg(group, mode=ImageReadMode.RGB, device="cuda") if batch > 1 else \
            [decode_jpeg(group[0], mode=ImageReadMode.RGB, device="cuda")]

    for group in groups[:2]:
        run(group)
    torch.cuda.synchronize()
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < min_seconds:
        for group in groups:
            run(group)
            done += len(group)
        torch.cuda.synchronize()
    return done / (time.perf_counter() - start)


def cuda_ms(fn, repeat: int = 20) -> float:
    """Median milliseconds of ``fn`` on the current stream, from CUDA events."""
    fn()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def transfer_comparison(batch: int) -> None:
    g = torch.Generator().manual_seed(0)
    host_uint8 = torch.randint(0, 256, (batch, 3, 224, 224), dtype=torch.uint8, generator=g)
    mean = torch.tensor(MEAN).view(1, 3, 1, 1)
    std = torch.tensor(STD).view(1, 3, 1, 1)
    torch.set_num_threads(1)
    t0 = time.thread_time()
    for _ in range(3):
        host_float = (host_uint8.float().div_(255) - mean) / std  # what ToTensor + Normalize compute
    host_ms = 1000 * (time.thread_time() - t0) / 3
    pinned_float, pinned_uint8 = host_float.pin_memory(), host_uint8.pin_memory()
    normalizer = DeviceNormalizer("cuda")
    float_copy = cuda_ms(lambda: pinned_float.to("cuda", non_blocking=True))
    uint8_copy = cuda_ms(lambda: pinned_uint8.to("cuda", non_blocking=True))
    uint8_total = cuda_ms(lambda: normalizer(pinned_uint8))
    out, _ = normalizer(pinned_uint8)
    err = (out - host_float.cuda()).abs().max().item()
    mb_f, mb_u = pinned_float.nbytes / 1e6, pinned_uint8.nbytes / 1e6
    print(f"\n2. one batch of {batch} images 3x224x224:")
    print(f"   host float32: normalize on one core {host_ms:7.2f} ms + pinned copy {float_copy:6.2f} ms "
          f"({mb_f:.0f} MB, {mb_f / float_copy:.1f} GB/s) = {host_ms + float_copy:7.2f} ms")
    print(f"   uint8+device: pinned copy {uint8_copy:6.2f} ms ({mb_u:.0f} MB, {mb_u / uint8_copy:.1f} GB/s) + "
          f"normalize kernel = {uint8_total:6.2f} ms   (max difference {err:.2e})")
    print(f"   per batch: {(host_ms + float_copy) / uint8_total:.1f}x less time, {mb_f / mb_u:.0f}x fewer bytes; "
          f"host CPU saved {host_ms / batch * 1000:.0f} us per image")


def torchvision_recipe(root, uint8: bool):
    from torchvision import datasets, transforms as T

    tail = [T.PILToTensor()] if uint8 else [T.ToTensor(), T.Normalize(MEAN, STD)]
    return datasets.ImageFolder(root, T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), *tail]))


def loader_rate(dataset, workers: int, batch: int, limit: int, uint8: bool, collate=None) -> float:
    loader = DataLoader(dataset, batch_size=batch, shuffle=True, num_workers=workers, pin_memory=True,
                        drop_last=True, prefetch_factor=4, collate_fn=collate, persistent_workers=True)
    normalizer = DeviceNormalizer("cuda") if uint8 else None
    seen, start = 0, None
    while seen < limit:
        for images, labels in loader:
            if normalizer is not None:
                images, labels = normalizer(images, labels)
            else:
                images, labels = images.to("cuda", non_blocking=True), labels.to("cuda", non_blocking=True)
            if start is None:
                torch.cuda.synchronize()
                start = time.perf_counter()
                continue
            seen += images.shape[0]
            if seen >= limit:
                break
    torch.cuda.synchronize()
    rate = seen / (time.perf_counter() - start)
    del loader
    return rate


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--files", type=int, default=2000)
    p.add_argument("--workers", type=int, default=None, help="DataLoader workers (default: cores - 1)")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--images", type=int, default=6000, help="images per end-to-end measurement")
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to measure (this benchmark needs a GPU)")
        return 0
    cores = os.cpu_count() or 1
    workers = args.workers or max(1, cores - 1)
    root = demo_dataset(DatasetSpec(n_files=args.files), progress=False)
    files = sorted(root.glob("*/*.jpg"))
    print(f"GPU {torch.cuda.get_device_name()}, {cores} cores, torch {torch.__version__}, {len(files)} JPEGs")

    blobs = [f.read_bytes() for f in files[:512]]
    print("\n1. decode rate on these ~500x400 JPEGs:")
    for name in available_decoders():
        print(f"   CPU {name:16s} {measure_decode_rate(name, blobs, min_seconds=1.5):9,.0f} img/s on one core")
    for batch in (1, 64):
        print(f"   nvJPEG batch {batch:<4d}     {nvjpeg_rate(blobs, batch):9,.0f} img/s (GPU, bytes copied in)")

    transfer_comparison(args.batch_size)

    crop = RandomResizedCrop(224)
    pipelines = {
        "(a) torchvision recipe, float32 normalized on the host": (torchvision_recipe(root, False), False, None),
        "(b) torchvision recipe, uint8, normalized on the GPU": (torchvision_recipe(root, True), True, collate_uint8),
        "(c) FastImageFolder, uint8, normalized on the GPU": (FastImageFolder(root, crop=crop), True, collate_uint8),
    }
    rates: dict[str, list[float]] = {name: [] for name in pipelines}
    for _ in range(args.rounds):
        for name, (dataset, uint8, collate) in pipelines.items():
            rates[name].append(loader_rate(dataset, workers, args.batch_size, args.images, uint8, collate))
    base = statistics.median(rates[next(iter(pipelines))])
    print(f"\n3. end to end, {workers} workers, batch {args.batch_size}, batches normalized on the GPU "
          f"(median of {args.rounds} interleaved rounds of {args.images} images):")
    for name, values in rates.items():
        rate = statistics.median(values)
        print(f"   {name:56s} {rate:8,.0f} img/s  {rate / base:5.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
