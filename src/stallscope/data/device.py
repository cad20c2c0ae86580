"""Keep images uint8 until they reach the device, then normalize there.

A 224x224 RGB image is 150 KB as uint8 and 600 KB as float32. Converting on the host (what
``ToTensor`` + ``Normalize`` do in every worker) costs CPU time, four times the shared-memory
traffic between workers and the main process, four times the pinned copy and four times the
PCIe transfer. On the device the same normalization is one fused elementwise kernel.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.utils.data import get_worker_info

from stallscope.data._memory import populate_for_reading
from stallscope.data._shared_batches import alias, is_batch_buffer, unreferenced

IMAGENET_MEAN: tuple[float, float, float] = (0.485, 0.456, 0.406)
IMAGENET_STD: tuple[float, float, float] = (0.229, 0.224, 0.225)


def collate_uint8(batch: Sequence[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack ``(uint8 CHW, label)`` samples into a uint8 NCHW batch and an int64 label vector.

    Samples from the datasets' batched fetch (``__getitems__``) are already slots of one
    channels-first batch (in shared memory inside a worker): that batch is returned as it is,
    no copy. Other
    samples are stacked channels-last (NHWC memory, NCHW shape), the layout decoders
    produce: stacking HWC images is a plain memcpy per image, where building NCHW memory
    would be a strided transpose several times slower. The device side converts the layout
    on uint8 data, or keeps it for channels-last models. In a worker the batch is allocated
    in shared memory directly, as ``default_collate`` does, so handing it to the main
    process passes a file descriptor, not the pixels.
    """
    if not batch:
        raise ValueError("collate_uint8 got an empty batch")
    first = batch[0][0]
    if first.dtype != torch.uint8 or first.dim() != 3:
        raise TypeError(f"collate_uint8 expects uint8 CHW tensors, got {first.dtype} with shape {tuple(first.shape)}")
    labels = torch.tensor([int(sample[1]) for sample in batch], dtype=torch.int64)
    stacked = _already_stacked([sample[0] for sample in batch])
    if stacked is not None:
        return stacked, labels
    channels, height, width = first.shape
    out = None
    if get_worker_info() is not None:
        storage = first._typed_storage()._new_shared(first.numel() * len(batch), device=first.device)
        out = first.new(storage).resize_(len(batch), height, width, channels)
    images = torch.stack([sample[0].permute(1, 2, 0) for sample in batch], out=out).permute(0, 3, 1, 2)
    return images, labels


def _already_stacked(images: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """The NCHW batch that ``images`` are consecutive slots of, exactly, or None.

    The datasets' ``__getitems__`` decodes a batch straight into one buffer; the batch is then
    that buffer, and stacking would only copy it. Only such buffers qualify (never a user's own
    storage, which the batch would then alias), and only when the samples are its consecutive
    slots covering all of it: a list the caller reordered or trimmed is stacked as usual.
    """
    first = images[0]
    size = first.numel()
    storage = first.untyped_storage()
    if not is_batch_buffer(storage):
        return None
    if not first.is_contiguous() or first.storage_offset() != 0 or storage.nbytes() != size * len(images):
        return None
    base = first.data_ptr()
    for k, image in enumerate(images):
        if (image.data_ptr() != base + k * size or image.shape != first.shape or not image.is_contiguous()
                or image.dtype != torch.uint8):
            return None
    if get_worker_info() is not None and not storage.is_shared():
        return None  # it would be copied into shared memory on its way to the main process anyway
    # torch accepts (storage, offset, size) without a stride (contiguous); its stubs want one
    return torch.empty(0, dtype=torch.uint8).set_(storage, 0, (len(images), *first.shape))  # type: ignore[call-overload]


class DeviceNormalizer:
    """Moves a uint8 batch to ``device`` and normalizes it there: ``(x / 255 - mean) / std``.

    ``dtype`` may be ``torch.float32``, ``torch.bfloat16`` or ``torch.float16``; half precision
    halves the activation memory of the first layer when the model runs under autocast.
    ``channels_last`` returns NHWC memory, which convolutions on Tensor Cores prefer.
    """

    def __init__(self, device: str | torch.device = "cuda", mean: Sequence[float] = IMAGENET_MEAN,
                 std: Sequence[float] = IMAGENET_STD, dtype: torch.dtype = torch.float32,
                 channels_last: bool = False) -> None:
        if len(mean) != len(std) or any(s <= 0 for s in std):
            raise ValueError("mean and std must have the same length and std must be positive")
        if dtype not in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
            raise ValueError(f"dtype must be a floating type, got {dtype}")
        self.device = torch.device(device)
        self.dtype = dtype
        self.channels_last = channels_last
        std_t = torch.tensor(std, dtype=torch.float32)
        # x * scale + shift, with the 1/255 folded in: one multiply-add per element.
        self._scale = (1.0 / (255.0 * std_t)).view(1, -1, 1, 1).to(self.device)
        self._shift = (-torch.tensor(mean, dtype=torch.float32) / std_t).view(1, -1, 1, 1).to(self.device)
        self._host_outputs = ReusedHostBuffers()

    def __call__(self, images: torch.Tensor, labels: torch.Tensor | None = None,
                 non_blocking: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        if images.dtype != torch.uint8:
            raise TypeError(f"expected a uint8 batch (use collate_uint8), got {images.dtype}")
        if images.dim() == 3:
            images = images.unsqueeze(0)
        if self.device.type == "cuda":
            # Pageable memory makes the copy synchronous and staged; pin_memory=True in the DataLoader does this
            # on its own thread instead. A batch already on the GPU (decode_jpegs_on_gpu's) needs no copy at all,
            # and pinning it would raise: only CPU tensors can be pinned.
            if images.device.type == "cpu" and not images.is_pinned():
                images = images.pin_memory()
            if labels is not None and labels.device.type == "cpu" and not labels.is_pinned():
                labels = labels.pin_memory()
        x = images.to(self.device, non_blocking=non_blocking)
        if labels is not None:
            labels = labels.to(self.device, non_blocking=non_blocking)
        if self.device.type == "cpu" and self.dtype == torch.float32:
            # The CPU fallback (no GPU): convert and change layout in one pass into a reused
            # buffer. A fresh 38 MB float batch costs more in page faults than in arithmetic.
            memory_format = torch.channels_last if self.channels_last else torch.contiguous_format
            out = self._host_outputs.take(x.shape, memory_format)
            if x.is_contiguous() and x.untyped_storage().is_shared():
                populate_for_reading(x)  # just received from a worker: fault it in at once
            _normalize_in_cache_sized_chunks(x, out, self._scale, self._shift)
            return out, labels
        # Layout changes happen on uint8 (a quarter of the bytes), then one in-place multiply-add.
        x = x.contiguous(memory_format=torch.channels_last if self.channels_last else torch.contiguous_format)
        compute = torch.float32 if self.dtype in (torch.bfloat16, torch.float16) else self.dtype
        out = x.to(compute).mul_(self._scale.to(compute)).add_(self._shift.to(compute))
        return out.to(self.dtype), labels


#: Bytes of float output per chunk: well inside a core's L2, so the three passes of the
#: normalization (convert, multiply, add) read and write memory once, not three times.
CHUNK_BYTES = 1 << 20


def _normalize_in_cache_sized_chunks(x: torch.Tensor, out: torch.Tensor, scale: torch.Tensor,
                                     shift: torch.Tensor) -> None:
    """``out = x * scale + shift``, a few images at a time.

    Three whole-batch passes over a 38 MB float batch move ~200 MB through memory; chunk by
    chunk the same arithmetic moves ~48 MB, which measured 2-3x faster in a busy pipeline.
    """
    per_image = out[0].numel() * out.element_size() if len(out) else 1
    step = max(1, CHUNK_BYTES // per_image)
    for start in range(0, len(out), step):
        chunk = out[start:start + step]
        chunk.copy_(x[start:start + step])
        chunk.mul_(scale).add_(shift)


class ReusedHostBuffers:
    """Float output batches on the host, each handed out again once nobody holds it any more.

    Why: a new 38 MB batch per step is a fresh ``mmap`` whose every page the kernel faults in
    and zeroes; on the CPU that costs more than the normalization arithmetic. The CUDA caching
    allocator already reuses device memory, so this is for the host only.

    Safety rests on the storage's reference count, not on the caller's habits: the caller gets
    a new tensor object (an alias) each time, and a buffer is reused only when no tensor, view,
    NumPy array, autograd graph or storage object outside this pool refers to its memory.
    Anything still held simply gets a new buffer. One pool per normalizer, not shared between
    threads: use one normalizer per thread.
    """

    def __init__(self, keep: int = 4) -> None:
        self.keep = keep
        self._buffers: list[torch.Tensor] = []
        self.reused = 0
        self.allocated = 0

    def take(self, shape: torch.Size, memory_format: torch.memory_format = torch.contiguous_format) -> torch.Tensor:
        inference = torch.is_inference_mode_enabled()  # an inference tensor cannot serve training, nor back
        for buffer in self._buffers:
            if (buffer.shape == shape and buffer.is_contiguous(memory_format=memory_format)
                    and buffer.is_inference() == inference and unreferenced(buffer)):
                self.reused += 1
                return alias(buffer)
        buffer = torch.empty(shape, dtype=torch.float32, memory_format=memory_format)
        self._buffers.append(buffer)
        if len(self._buffers) > self.keep:
            self._buffers.pop(0)  # still held by the caller, or of an old shape: forget it
        self.allocated += 1
        return alias(buffer)



def to_device(batch: tuple[torch.Tensor, torch.Tensor], device: str | torch.device = "cuda",
              mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD,
              dtype: torch.dtype = torch.float32, non_blocking: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """One-call form of :class:`DeviceNormalizer` (which caches mean/std on the device: prefer it in loops)."""
    images, labels = batch
    out, labels_out = DeviceNormalizer(device, mean, std, dtype)(images, labels, non_blocking)
    assert labels_out is not None
    return out, labels_out


def decode_jpegs_on_gpu(blobs: Sequence[bytes], device: str | torch.device = "cuda") -> list[torch.Tensor]:
    """Decode JPEG bytes with nvJPEG (``torchvision.io.decode_jpeg(device="cuda")``): uint8 CHW on the GPU.

    Moves the decode off the CPU entirely; crops and resizes then run on the device. Needs a
    CUDA build of torchvision and a GPU.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("nvJPEG decoding needs a CUDA device; none is available")
    from torchvision.io import ImageReadMode, decode_jpeg

    tensors = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in blobs]
    return list(decode_jpeg(tensors, mode=ImageReadMode.RGB, device=device))
