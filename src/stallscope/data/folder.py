"""``FastImageFolder``: torchvision's ImageFolder layout, decoded at the size the crop needs."""

from __future__ import annotations

import os
import warnings

from torch.utils.data import Dataset

from stallscope.data._decoding import MapDecodingMixin
from stallscope.data.crops import CropSpec
from stallscope.data.decoders import Decoder
from stallscope.data.files import read_regular
from stallscope.data.sources import IMAGE_EXTENSIONS, SourceList, list_image_folder, read_file_list, regular_only

#: Files left out of a dataset named in its warning; the rest are counted.
NAMED_LEFT_OUT = 5


def _regular_files(source: SourceList) -> SourceList:
    """The source less what is not a regular file (a device, a FIFO, ... named like an image), with a warning
    naming those: reading one in a worker would never end or never return."""
    kept, left_out = regular_only(source)
    if left_out:
        named = "; ".join(f"{path}: {reason}" for path, reason in left_out[:NAMED_LEFT_OUT])
        more = f"; and {len(left_out) - NAMED_LEFT_OUT} more" if len(left_out) > NAMED_LEFT_OUT else ""
        warnings.warn(f"FastImageFolder: left out {len(left_out)} path(s) that are not regular files: {named}{more}",
                      stacklevel=3)
    return kept


class FastImageFolder(MapDecodingMixin, Dataset):
    """Map-style dataset over ``root/<class>/<image>``, yielding ``(uint8 CHW tensor, label)``.

    A drop-in for ``ImageFolder(root, Compose([RandomResizedCrop(224), RandomHorizontalFlip(),
    ToTensor(), Normalize(...)]))``: same classes, same sample order, crops equal in
    distribution, but the image stays uint8 so collate, pinning and the host-to-device copy move
    a quarter of the bytes, and normalization happens on the device (see
    :func:`stallscope.data.to_device`). Use ``collate_fn=collate_uint8`` in the DataLoader.

    ``crop`` is a :class:`RandomResizedCrop` (training, flip included), a
    :class:`ResizeCenterCrop` (evaluation) or :class:`FullImage`. ``decoder`` is ``"auto"``
    (fastest installed), ``"simplejpeg"``, ``"opencv"`` or ``"pillow"``. ``recycle_batches``:
    workers reuse a batch's shared memory once the training process has dropped every
    reference to it (a batch sent on to another process is never reused); False gives every
    batch fresh memory, as torch does.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        crop: CropSpec | None = None,
        decoder: str | Decoder = "auto",
        dct_scaling: bool = True,
        extensions: tuple[str, ...] = IMAGE_EXTENSIONS,
        recycle_batches: bool = True,
    ) -> None:
        self._init_decoding(crop, decoder, dct_scaling)
        self.recycle_batches = recycle_batches
        self.source = _regular_files(list_image_folder(root, extensions))
        self.root = self.source.root

    @classmethod
    def from_file_list(
        cls,
        list_path: str | os.PathLike[str],
        crop: CropSpec | None = None,
        decoder: str | Decoder = "auto",
        dct_scaling: bool = True,
        recycle_batches: bool = True,
    ) -> FastImageFolder:
        """The same dataset over a ``path,label`` list instead of a folder tree."""
        self = cls.__new__(cls)
        self._init_decoding(crop, decoder, dct_scaling)
        self.recycle_batches = recycle_batches
        self.source = _regular_files(read_file_list(list_path))
        self.root = self.source.root
        return self

    @property
    def classes(self) -> list[str]:
        return list(self.source.classes)

    @property
    def class_to_idx(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.source.classes)}

    @property
    def samples(self) -> list[tuple[str, int]]:
        return [(str(p), label) for p, label in self.source.samples]

    @property
    def targets(self) -> list[int]:
        return [label for _, label in self.source.samples]

    def __len__(self) -> int:
        return len(self.source.samples)

    def _read(self, index: int) -> tuple[bytes, int, str]:
        path, label = self.source.samples[index]
        return read_regular(path), label, str(path)

    def __repr__(self) -> str:
        return f"FastImageFolder({str(self.root)!r}, {len(self)} images, {len(self.classes)} classes, crop={self.crop})"
