"""The fast data path against torchvision's ImageNet recipe, side by side in one run.

Pipelines, each through a DataLoader with the best worker count found for this machine, each
ending in normalized float32 batches (normalization on the CPU here, as there is no GPU):

  (a) torchvision ImageFolder + RandomResizedCrop(224) + RandomHorizontalFlip + ToTensor + Normalize
  (b) stallscope FastImageFolder (crop chosen from the header, fastest decoder, uint8 collate)
  (c) stallscope PackedImageDataset over LMDB
  (d) stallscope PackedImageDataset over WebDataset tar shards

It also measures each decoder's single-core full-size decode rate on the same files, and
states each pipeline's images/s per core as a fraction of its decoder's limit.

Usage: python benchmarks/fastpath.py [--files 2000] [--rounds 2]

Measured on 2 cores shared with other jobs (x86_64, Python 3.11, torch 2.14.1 CPU build),
2,000 demo JPEGs of ~500x400, batch 64, normalization on the CPU in the main process:

  (a) torchvision recipe             2 workers  156 img/s  1.00x  pillow           23% of limit
  (b) FastImageFolder                1 worker   320 img/s  2.05x  simplejpeg-fast  11%
  (c) PackedImageDataset, LMDB       2 workers  339 img/s  2.17x  simplejpeg-fast  11%
  (d) PackedImageDataset, shards     1 worker   329 img/s  2.11x  simplejpeg-fast  11%
  single-core decode: simplejpeg-fast 1,486, simplejpeg 1,042, opencv 961, pillow 344 img/s

The machine was heavily loaded during that run (Pillow decoded 344 img/s against ~600 on an
idle core), so absolute numbers are low and noisy. CPU time per image in one process,
which contention affects far less: (a) 3.0 ms, (b) 1.6 ms, (c) 1.6 ms (about 1.9x), of
which about 0.5 ms is the float conversion and normalization that a GPU would do instead.
The 3x target was not met here.

Re-run 2026-11-30 on the idle machine (--rounds 2): (a) 622 img/s with 2 workers; (b) 1,520 (2.44x);
(c) 1,338 with 3 workers (2.15x); (d) 1,552 (2.49x); single-core decode: simplejpeg-fast 1,881,
simplejpeg 1,647, opencv 1,501, pillow 811 img/s. Still short of 3x: (b) spends ~1.7 ms of CPU per image
(decode 0.63, resize 0.15, collate 0.12, normalization 0.25-0.5 in the main process).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from stallscope.data import (
    DeviceNormalizer,
    FastImageFolder,
    PackedImageDataset,
    PackOptions,
    RandomResizedCrop,
    available_decoders,
    collate_uint8,
    measure_decode_rate,
    pack,
)
from stallscope.demo.dataset import DatasetSpec, demo_dataset


def torchvision_dataset(root: Path):
    from torchvision import datasets, transforms as T

    return datasets.ImageFolder(root, T.Compose([
        T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
        T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    ]))


DEVICE = "cpu"  # --device cuda: batches end on the GPU (uint8 ones normalized there)


def images_per_second(dataset, workers: int, batch_size: int, limit: int, uint8: bool) -> float:
    """Drain ``limit`` images; the clock starts at the first batch, so worker start-up is excluded."""
    on_gpu = DEVICE != "cpu"
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=workers,
                        collate_fn=collate_uint8 if uint8 else None, persistent_workers=False,
                        prefetch_factor=4 if workers else None, drop_last=True, pin_memory=on_gpu)
    normalize = DeviceNormalizer(DEVICE) if uint8 else None
    seen, start = 0, None
    for images, labels in loader:
        if normalize is not None:
            images, labels = normalize(images, labels)
        elif on_gpu:
            images, labels = images.to(DEVICE, non_blocking=True), labels.to(DEVICE, non_blocking=True)
        if start is None:
            if on_gpu:
                torch.cuda.synchronize()
            start = time.perf_counter()
            continue
        seen += images.shape[0]
        if seen >= limit:
            break
    if on_gpu:
        torch.cuda.synchronize()
    del loader
    return seen / (time.perf_counter() - start)


def best_workers(dataset, candidates: list[int], batch_size: int, uint8: bool) -> tuple[int, dict[int, float]]:
    probe = {w: images_per_second(dataset, w, batch_size, 6 * batch_size, uint8) for w in candidates}
    return max(probe, key=probe.get), probe


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2, help="full measurements per pipeline (median reported)")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda: batches are moved to the GPU and the "
                        "uint8 pipelines normalize there (the torchvision recipe normalizes on the CPU)")
    parser.add_argument("--work", default=None, help="where to put the packs (default: a temporary folder)")
    args = parser.parse_args()
    global DEVICE
    DEVICE = args.device

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    cores = os.cpu_count() or 1
    root = demo_dataset(DatasetSpec(n_files=args.files), progress=True)
    files = sorted(root.glob("*/*.jpg"))
    gpu = f", batches to {torch.cuda.get_device_name()}" if DEVICE != "cpu" else ", normalization on the CPU"
    print(f"machine: {platform.processor() or platform.machine()}, {cores} cores, torch {torch.__version__}{gpu}")
    print(f"dataset: {len(files)} JPEGs in {root}")

    blobs = [p.read_bytes() for p in files[:300]]
    rates = {name: measure_decode_rate(name, blobs, min_seconds=2.0) for name in available_decoders()}

    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="stallscope-fastpath-"))
    packs = {}
    for fmt in ("lmdb", "wds"):
        out = work / f"pack-{fmt}"
        t0 = time.perf_counter()
        result = pack(root, out, PackOptions(format=fmt, workers=cores))
        packs[fmt] = out
        print(f"packed {result.records} records as {fmt} in {time.perf_counter() - t0:.1f} s")

    crop = RandomResizedCrop(224)
    pipelines = {
        "(a) torchvision ImageFolder+RRC+flip+ToTensor+Normalize": (torchvision_dataset(root), False, "pillow"),
        "(b) FastImageFolder": (FastImageFolder(root, crop=crop), True, None),
        "(c) PackedImageDataset, LMDB": (PackedImageDataset(packs["lmdb"], crop=crop), True, None),
        "(d) PackedImageDataset, tar shards": (PackedImageDataset(packs["wds"], crop=crop), True, None),
    }
    candidates = sorted({1, max(1, cores // 2), cores, cores + 1})
    chosen = {}
    for name, (dataset, uint8, _) in pipelines.items():
        chosen[name], probe = best_workers(dataset, candidates, args.batch_size, uint8)
        print(f"workers probe {name[:3]}: " + ", ".join(f"{w}: {r:,.0f} img/s" for w, r in probe.items()))

    measured: dict[str, list[float]] = {name: [] for name in pipelines}
    for _ in range(args.rounds):  # interleaved, so drift on a shared machine hits all pipelines alike
        for name, (dataset, uint8, _) in pipelines.items():
            limit = min(len(dataset), args.files) - 2 * args.batch_size
            measured[name].append(images_per_second(dataset, chosen[name], args.batch_size, limit, uint8))

    baseline = statistics.median(measured[next(iter(pipelines))])
    print()
    print(f"{'pipeline':58s} {'workers':>7s} {'img/s':>8s} {'vs (a)':>7s} {'decoder':>10s} {'per core':>9s} "
          f"{'of limit':>8s}")
    for name, (dataset, _, decoder) in pipelines.items():
        rate = statistics.median(measured[name])
        decoder = decoder or dataset.decoder_name
        per_core = rate / cores
        print(f"{name:58s} {chosen[name]:7d} {rate:8,.0f} {rate / baseline:6.2f}x {decoder:>10s} "
              f"{per_core:9,.0f} {per_core / rates[decoder]:8.0%}")
    print()
    print("single-core full-size decode rate on these files (the per-core limit):")
    for name, rate in rates.items():
        print(f"  {name:10s} {rate:8,.0f} img/s")
    print(f"(img/s: median of {args.rounds} interleaved runs of ~{args.files} images after the first batch; "
          f"per core = img/s / {cores} cores; of limit = per core / that decoder's single-core rate)")


if __name__ == "__main__":
    main()
