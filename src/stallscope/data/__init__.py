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
from stallscope.data.pack import PackError, PackOptions, PackResult, VerifyResult, pack, verify
from stallscope.data.packed import PackedImageDataset, PackedImageIterable
from stallscope.data.sources import SourceError

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "CropPlan",
    "DecodeError",
    "DeviceNormalizer",
    "FastImageFolder",
    "FullImage",
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
