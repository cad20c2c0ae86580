"""Peer data pipelines that ``benchmarks/fastpath.py --peers`` measures beside stallscope's fast path.

Each peer runs its own recommended parallelism (threads, not DataLoader processes) and ends, like the pipelines
in fastpath.py, in uint8 NCHW batches that the main thread normalizes on the CPU to float32 NCHW with ImageNet
mean/std through stallscope's ``DeviceNormalizer("cpu")``, so only the loading differs.

SPDL (Meta), spdl 0.8.0 (``pip install spdl==0.8.0``: the meta-package pulling spdl_io 0.8.0 and spdl_core 0.8.0;
0.8.0 is the newest on PyPI and works on Python 3.11). Its wheels carry bindings for FFmpeg 4 to 9 and load the newest
one found; on Debian 12 (bookworm) that is FFmpeg 5.1 (``_spdl_ffmpeg5``), from these Debian packages, all at
version 7:5.1.9-0+deb12u1: libavutil57, libavcodec59, libavformat59, libavfilter8, libavdevice59, libswscale6,
libswresample4 (and libpostproc56, pulled in by libavfilter8), installed with
``apt-get install --no-install-recommends libavutil57 libavcodec59 libavformat59 libavfilter8 libavdevice59``.
Per image, in a pool of ``threads`` pipeline threads (decode concurrency 2 x threads): read the file's bytes, demux
them (``spdl.io.demux_image``: the size, from the header), draw a RandomResizedCrop box (area 0.08-1, aspect 3/4-4/3,
torchvision's sampling) and a coin flip, then decode with SPDL's FFmpeg decoder through the filter graph
``crop=w:h:x:y,scale=224:224:flags=bilinear[,hflip],format=rgb24`` (random horizontal flip: yes). FFmpeg decodes the
whole image, then crops (rounding the box to even pixels on 4:2:0). A batch stage merges ``batch_size`` frames into one
buffer (``spdl.io.convert_frames``), wraps it as a torch tensor (NHWC, zero-copy) and makes it NCHW uint8.

NVIDIA DALI on the CPU: ``nvidia-dali-cuda130`` 2.4.0 is on PyPI (so are the cuda120 ones) and installs here with
``pip install nvidia-dali-cuda130==2.4.0`` (about 200 MB with nvidia-nvimgcodec-cu13 and friends; it pins
packaging<=26.3). It runs CPU-only with ``device_id=None``: fn.readers.file (reshuffled every epoch), DALI's
ImageNet recipe ``fn.decoders.image_random_crop`` (region decode, same area/aspect ranges) and fn.resize to 224 or,
with ``fused=False``, fn.decoders.image + fn.random_resized_crop; then fn.crop_mirror_normalize with a coin-flip
mirror to uint8 CHW (normalization left to the main thread, as above).

Measured 2026-12-07 on the 2-core machine with nothing else running, ImageNet-like band (768 JPEGs ~500x400),
batch 32, 3 s per point, two rounds, img/s at 1 | 2 | 3 | 4 threads:
  SPDL       356-358 | 548-558 | 518-581 | 507-576   (single-thread decode+crop+scale alone: ~530 img/s)
  DALI (CPU) 453-456 | 681-730 | 727-728 | 664-730   (fused=False at 1 | 2: 419 | 637)
"""
from __future__ import annotations

import io
import math
import random
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import torch

from stallscope.data import DeviceNormalizer

SCALE = (0.08, 1.0)
RATIO = (3 / 4, 4 / 3)


def random_resized_crop_box(width: int, height: int, rng: random.Random) -> tuple[int, int, int, int]:
    """``(x, y, w, h)`` drawn as torchvision's RandomResizedCrop does, so every peer crops the same distribution."""
    area = width * height
    log_ratio = (math.log(RATIO[0]), math.log(RATIO[1]))
    for _ in range(10):
        target = area * rng.uniform(*SCALE)
        aspect = math.exp(rng.uniform(*log_ratio))
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            return rng.randint(0, width - w), rng.randint(0, height - h), w, h
    aspect = width / height  # fallback: the centre crop of the whole image, its aspect clamped to RATIO
    if aspect < RATIO[0]:
        w, h = width, round(width / RATIO[0])
    elif aspect > RATIO[1]:
        w, h = round(height * RATIO[1]), height
    else:
        w, h = width, height
    return (width - w) // 2, (height - h) // 2, w, h


def _endless(files: Sequence[Path], rng: random.Random) -> Iterator[Path]:
    """The files over and over, reshuffled every pass: epochs never end a measurement."""
    order = list(files)
    while True:
        rng.shuffle(order)
        yield from order


def _tiny_jpeg() -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (16, 16), (200, 100, 50)).save(out, "JPEG")
    return out.getvalue()


def _one_line(err: BaseException, limit: int = 200) -> str:
    text = " ".join(str(err).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def spdl_unavailable() -> str | None:
    """None when SPDL imports and its FFmpeg bindings decode a JPEG; else why not, in one line."""
    try:
        import spdl.io
        import spdl.pipeline  # noqa: F401
    except ImportError as err:
        return f"spdl is not installed (pip install spdl==0.8.0): {_one_line(err)}"
    try:
        spdl.io.load_image(_tiny_jpeg())
    except Exception as err:  # the bindings load lazily: a missing FFmpeg shows up here
        if "Failed to import libspdl" in str(err):
            return ("SPDL finds no FFmpeg 4-9 shared libraries (Debian 12: apt-get install libavutil57 libavcodec59 "
                    "libavformat59 libavfilter8 libavdevice59)")
        return f"SPDL cannot decode a JPEG: {_one_line(err)}"
    return None


def spdl_filter(box: tuple[int, int, int, int], crop: int, flip: bool) -> str:
    """FFmpeg filter graph: crop the box, scale it to crop x crop, maybe mirror (after the scale: fewer pixels), RGB."""
    x, y, w, h = box
    return f"crop={w}:{h}:{x}:{y},scale={crop}:{crop}:flags=bilinear{',hflip' if flip else ''},format=rgb24"


def _spdl_load(path: Path, crop: int, rng: random.Random) -> Any:
    """Read, demux (header only, for the size), then decode through the crop/scale filter graph."""
    import spdl.io

    packets = spdl.io.demux_image(path.read_bytes())
    box = random_resized_crop_box(packets.width, packets.height, rng)
    return spdl.io.decode_packets(packets, filter_desc=spdl_filter(box, crop, rng.random() < 0.5))


def _spdl_collate(frames: list) -> torch.Tensor:
    """One buffer for the batch (NHWC), as uint8 NCHW like stallscope's collate_uint8."""
    import spdl.io

    return spdl.io.to_torch(spdl.io.convert_frames(frames)).permute(0, 3, 1, 2).contiguous()


def _measure(batches: Iterator[torch.Tensor], seconds: float, warmup: int) -> float:
    """Images/s over ``seconds`` of wall time once ``warmup`` batches are drained, each normalized in this thread."""
    normalize = DeviceNormalizer("cpu")
    seen, start = 0, 0.0
    for i, images in enumerate(batches):
        normalize(images)
        if i == warmup:
            start = time.perf_counter()
        elif i > warmup:
            seen += images.shape[0]
            if time.perf_counter() - start >= seconds:
                return seen / (time.perf_counter() - start)
    raise RuntimeError("the pipeline ended before the measurement did")


def spdl_images_per_second(files: list[Path], batch_size: int, seconds: float, threads: int,
                           crop: int = 224) -> float:
    """Steady-state images/s of SPDL's thread pipeline: a pool of ``threads`` threads decodes and batches.

    Decode concurrency is ``2 x threads`` so a thread never idles waiting for the event loop to hand it the next file;
    measured here, that beat concurrency == threads (600 vs 560 img/s at 2), and an extra pool thread for the batch
    stage was slower (500).
    """
    from spdl.pipeline import PipelineBuilder

    if len(files) < batch_size:
        raise ValueError(f"need at least {batch_size} files for one batch, got {len(files)}")
    rng = random.Random(0)
    sink = 3
    pipeline = (
        PipelineBuilder[Path, torch.Tensor]()
        .add_source(_endless(files, rng))
        .pipe(lambda path: _spdl_load(path, crop, rng), concurrency=2 * threads, name="decode")
        .aggregate(batch_size, drop_last=True)
        .pipe(_spdl_collate, name="collate")
        .add_sink(sink)
        .build(num_threads=threads)
    )
    with pipeline.auto_stop():
        return _measure(pipeline.get_iterator(timeout=120), seconds, max(2 * threads, sink + 2))


def _best(rate: Callable[[int], float], thread_counts: Sequence[int]) -> tuple[float, int]:
    rates = {n: rate(n) for n in thread_counts}
    best = max(rates, key=rates.__getitem__)
    return rates[best], best


def spdl_best(files: list[Path], batch_size: int, seconds: float,
              thread_counts: Sequence[int] = (1, 2, 3, 4)) -> tuple[float, int]:
    """SPDL at its best thread count on this machine: ``(images/s, threads)`` of a short probe."""
    return _best(lambda n: spdl_images_per_second(files, batch_size, seconds, n), thread_counts)


def dali_unavailable() -> str | None:
    """None when DALI imports (CPU-only use needs no GPU or driver); else why not, in one line."""
    try:
        from nvidia.dali import fn, pipeline_def, types  # noqa: F401
    except ImportError as err:
        return f"nvidia-dali is not installed (pip install nvidia-dali-cuda130==2.4.0): {_one_line(err)}"
    except Exception as err:  # a broken install raises other errors at import
        return f"nvidia-dali does not load: {_one_line(err)}"
    return None


def dali_images_per_second(files: list[Path], batch_size: int, seconds: float, threads: int,
                           crop: int = 224, fused: bool = True) -> float:
    """Steady-state images/s of a CPU-only DALI pipeline with ``threads`` worker threads.

    ``fused``: DALI's ImageNet recipe, decoding only the random region (image_random_crop + resize); else a full
    decode followed by random_resized_crop.
    """
    import numpy as np
    from nvidia import dali

    fn, types, pipeline_def = cast(Any, dali.fn), cast(Any, dali.types), cast(Any, dali.pipeline_def)  # loose stubs

    @pipeline_def(batch_size=batch_size, num_threads=threads, device_id=None, seed=0, prefetch_queue_depth=2)
    def graph():  # type: ignore[no-untyped-def]
        jpegs, _ = fn.readers.file(files=[str(f) for f in files], shuffle_after_epoch=True, name="reader")
        area, aspect = list(SCALE), list(RATIO)
        if fused:
            images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB, random_area=area,
                                                   random_aspect_ratio=aspect, num_attempts=10)
            images = fn.resize(images, resize_x=crop, resize_y=crop)
        else:
            images = fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)
            images = fn.random_resized_crop(images, size=[crop, crop], random_area=area, random_aspect_ratio=aspect)
        return fn.crop_mirror_normalize(images, dtype=types.UINT8, output_layout="CHW",
                                        mirror=fn.random.coin_flip())

    def batches(pipe: Any) -> Iterator[torch.Tensor]:
        pipe.build()
        while True:  # an output lives until the next run(): _measure normalizes it before asking again
            (out,) = pipe.run()
            yield torch.from_numpy(np.asarray(out.as_tensor()))

    return _measure(batches(graph()), seconds, max(2 * threads, 4))


def dali_best(files: list[Path], batch_size: int, seconds: float,
              thread_counts: Sequence[int] = (1, 2, 3, 4)) -> tuple[float, int]:
    """DALI (CPU) at its best thread count on this machine: ``(images/s, threads)`` of a short probe."""
    return _best(lambda n: dali_images_per_second(files, batch_size, seconds, n), thread_counts)
