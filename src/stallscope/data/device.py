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

IMAGENET_MEAN: tuple[float, float, float] = (0.485, 0.456, 0.406)
IMAGENET_STD: tuple[float, float, float] = (0.229, 0.224, 0.225)


def collate_uint8(batch: Sequence[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack ``(uint8 CHW, label)`` samples into a uint8 NCHW batch and an int64 label vector.

    The batch is laid out channels-last (NHWC memory, NCHW shape), the layout decoders
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
    channels, height, width = first.shape
    out = None
    if get_worker_info() is not None:
        storage = first._typed_storage()._new_shared(first.numel() * len(batch), device=first.device)
        out = first.new(storage).resize_(len(batch), height, width, channels)
    images = torch.stack([sample[0].permute(1, 2, 0) for sample in batch], out=out).permute(0, 3, 1, 2)
    labels = torch.tensor([int(sample[1]) for sample in batch], dtype=torch.int64)
    return images, labels


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

    def __call__(self, images: torch.Tensor, labels: torch.Tensor | None = None,
                 non_blocking: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        if images.dtype != torch.uint8:
            raise TypeError(f"expected a uint8 batch (use collate_uint8), got {images.dtype}")
        if images.dim() == 3:
            images = images.unsqueeze(0)
        if self.device.type == "cuda" and not images.is_pinned():
            # Pageable memory makes the copy synchronous and staged; pin_memory=True in the
            # DataLoader does this on its own thread instead.
            images = images.pin_memory()
            if labels is not None and not labels.is_pinned():
                labels = labels.pin_memory()
        x = images.to(self.device, non_blocking=non_blocking)
        if labels is not None:
            labels = labels.to(self.device, non_blocking=non_blocking)
        # Layout changes happen on uint8 (a quarter of the bytes), then one in-place multiply-add.
        x = x.contiguous(memory_format=torch.channels_last if self.channels_last else torch.contiguous_format)
        compute = torch.float32 if self.dtype in (torch.bfloat16, torch.float16) else self.dtype
        out = x.to(compute).mul_(self._scale.to(compute)).add_(self._shift.to(compute))
        return out.to(self.dtype), labels


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
