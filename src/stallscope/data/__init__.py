"""The fast data path: packed datasets, JPEG decoding at the size needed, normalization on the device.

Typical use, replacing ``ImageFolder`` + ``RandomResizedCrop`` + ``ToTensor`` + ``Normalize``::

    from stallscope.data import FastImageFolder, RandomResizedCrop, collate_uint8, DeviceNormalizer
    ds = FastImageFolder("train/", crop=RandomResizedCrop(224))       # or PackedImageDataset("train.lmdb")
    loader = DataLoader(ds, batch_size=256, shuffle=True, num_workers=8, pin_memory=True,
                        collate_fn=collate_uint8, persistent_workers=True)
    normalize = DeviceNormalizer("cuda", dtype=torch.bfloat16)
    for images, labels in loader:
        images, labels = normalize(images, labels)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: name -> defining module. Imported on first use (PEP 562), so ``stallscope pack`` and
#: ``--verify`` start without importing torch.
_EXPORTS: dict[str, str] = {
    "CropPlan": "crops",
    "FullImage": "crops",
    "RandomResizedCrop": "crops",
    "ResizeCenterCrop": "crops",
    "DecodeError": "decoders",
    "available_decoders": "decoders",
    "get_decoder": "decoders",
    "measure_decode_rate": "decoders",
    "IMAGENET_MEAN": "device",
    "IMAGENET_STD": "device",
    "DeviceNormalizer": "device",
    "collate_uint8": "device",
    "decode_jpegs_on_gpu": "device",
    "to_device": "device",
    "FastImageFolder": "folder",
    "PackFormatError": "index",
    "load_index": "index",
    "PackError": "packing",
    "PackOptions": "packing",
    "PackResult": "packing",
    "VerifyResult": "packing",
    "pack": "packing",
    "verify": "packing",
    "PackedImageDataset": "packed",
    "PackedImageIterable": "packed",
    "SourceError": "sources",
}

if TYPE_CHECKING:
    from stallscope.data.crops import CropPlan, FullImage, RandomResizedCrop, ResizeCenterCrop
    from stallscope.data.decoders import DecodeError, available_decoders, get_decoder, measure_decode_rate
    from stallscope.data.device import (
        IMAGENET_MEAN,
        IMAGENET_STD,
        DeviceNormalizer,
        collate_uint8,
        decode_jpegs_on_gpu,
        to_device,
    )
    from stallscope.data.folder import FastImageFolder
    from stallscope.data.index import PackFormatError, load_index
    from stallscope.data.packed import PackedImageDataset, PackedImageIterable
    from stallscope.data.packing import PackError, PackOptions, PackResult, VerifyResult, pack, verify
    from stallscope.data.sources import SourceError


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'stallscope.data' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"stallscope.data.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)


__all__ = [
    "CropPlan",
    "DecodeError",
    "DeviceNormalizer",
    "FastImageFolder",
    "FullImage",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "PackError",
    "PackFormatError",
    "PackOptions",
    "PackResult",
    "PackedImageDataset",
    "PackedImageIterable",
    "RandomResizedCrop",
    "ResizeCenterCrop",
    "SourceError",
    "VerifyResult",
    "available_decoders",
    "collate_uint8",
    "decode_jpegs_on_gpu",
    "get_decoder",
    "load_index",
    "measure_decode_rate",
    "pack",
    "to_device",
    "verify",
]
