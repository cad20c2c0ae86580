"""Shared machinery of the datasets: per-process decoder, crop, and the uint8 CHW output."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import get_worker_info

from stallscope.data._shared_batches import new_shared_batch, register_batch_buffer, worker_pool
from stallscope.data.cropdecode import decode_crop, write_planes
from stallscope.data.crops import CropSpec, RandomResizedCrop, ResizeCenterCrop
from stallscope.data.decoders import DecodeError, Decoder, get_decoder


class DecodingMixin:
    """Turns encoded bytes into ``(uint8 CHW tensor, label)``.

    The decoder object is created lazily in whichever process first decodes: it is neither
    pickled to spawned workers nor shared across a fork, and ``decoder_name`` says which
    backend runs (``"auto"`` resolves to the fastest installed).
    """

    crop: CropSpec
    dct_scaling: bool
    _decoder_choice: str | Decoder
    _decoder: Decoder | None

    def _init_decoding(self, crop: CropSpec | None, decoder: str | Decoder, dct_scaling: bool) -> None:
        self.crop = crop if crop is not None else RandomResizedCrop(224)
        if not hasattr(self.crop, "plan"):
            raise TypeError(f"crop must be a RandomResizedCrop, ResizeCenterCrop or FullImage, got {crop!r}")
        self.dct_scaling = dct_scaling
        self._decoder_choice = decoder
        self._decoder = get_decoder(decoder)  # fail now, in the caller, if the backend is missing

    @property
    def decoder_name(self) -> str:
        return self._get_decoder().name

    def _get_decoder(self) -> Decoder:
        if self._decoder is None:
            self._decoder = get_decoder(self._decoder_choice)
        return self._decoder

    def _decode_pixels(self, data: bytes, what: str, planes: np.ndarray | None = None) -> np.ndarray:
        try:
            return decode_crop(data, self.crop, self._get_decoder(), dct_scaling=self.dct_scaling, planes=planes)
        except DecodeError as exc:
            raise DecodeError(f"{what}: {exc}") from exc

    def _decode_sample(self, data: bytes, what: str) -> torch.Tensor:
        return torch.from_numpy(self._decode_pixels(data, what)).permute(2, 0, 1)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_decoder"] = None
        if isinstance(state["_decoder_choice"], Decoder):
            state["_decoder_choice"] = state["_decoder_choice"].name
        return state


class MapDecodingMixin(DecodingMixin):
    """Random access by index for the map-style datasets, one sample or a whole batch.

    Subclasses provide ``_read(index) -> (bytes, label, what)``, ``what`` naming the sample
    in error messages. ``__getitems__``, which the DataLoader calls for a whole batch when a
    dataset has it, decodes every image of a batch straight into one batch buffer.
    """

    #: In DataLoader workers, reuse batch buffers the main process has released (see
    #: :mod:`stallscope.data._shared_batches`); False: fresh memory for every batch.
    recycle_batches: bool = True

    def _read(self, index: int) -> tuple[bytes, int, str]:
        raise NotImplementedError

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        data, label, what = self._read(index)
        return self._decode_sample(data, what), label

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[torch.Tensor, int]]:
        """The samples of one batch, equal to ``[dataset[i] for i in indices]``.

        With a crop of fixed output size (RandomResizedCrop, ResizeCenterCrop), the images are
        written straight into consecutive slots of one channels-first uint8 batch, allocated in
        shared memory inside a worker, and each sample is a view of its slot: :func:`collate_uint8`
        then hands that batch on without stacking (a copy of every image saved), and any other
        collate function still sees ordinary samples.
        """
        if not isinstance(self.crop, (RandomResizedCrop, ResizeCenterCrop)) or len(indices) < 2:
            return [self[index] for index in indices]
        samples: list[tuple[torch.Tensor, int]] = []
        batch: torch.Tensor | None = None
        slots: np.ndarray | None = None
        for k, index in enumerate(indices):
            data, label, what = self._read(index)
            slot = None if slots is None else slots[k]
            pixels = self._decode_pixels(data, what, slot)
            if k == 0:
                height, width, channels = pixels.shape
                batch = _batch_buffer((len(indices), channels, height, width), self.recycle_batches)
                slots = batch.numpy()
                slot = slots[0]
                write_planes(pixels, slot)
                pixels = slot
            if pixels is slot and batch is not None:
                image = batch[k]  # a view of the batch tensor itself (from_numpy would make a storage of its own)
            else:
                image = torch.from_numpy(pixels).permute(2, 0, 1)
            samples.append((image, label))
        return samples


def _batch_buffer(shape: tuple[int, ...], recycle: bool = True) -> torch.Tensor:
    """An uninitialised uint8 batch; in a DataLoader worker, in shared memory.

    Shared memory is where ``default_collate`` puts a worker's batch too: sending it to the
    main process then passes a file descriptor instead of copying the pixels. With ``recycle``
    the buffer comes from the worker's pool (see :mod:`stallscope.data._shared_batches`).
    """
    if get_worker_info() is None:
        return register_batch_buffer(torch.empty(shape, dtype=torch.uint8))
    if recycle:
        return worker_pool().take(shape)
    return new_shared_batch(shape)
