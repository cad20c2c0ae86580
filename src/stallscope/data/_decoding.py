"""Shared machinery of the datasets: per-process decoder, crop, and the uint8 CHW output."""

from __future__ import annotations

from typing import Any

import torch

from stallscope.data.cropdecode import decode_crop
from stallscope.data.crops import CropSpec, RandomResizedCrop
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

    def _decode_sample(self, data: bytes, what: str) -> torch.Tensor:
        try:
            pixels = decode_crop(data, self.crop, self._get_decoder(), dct_scaling=self.dct_scaling)
        except DecodeError as exc:
            raise DecodeError(f"{what}: {exc}") from exc
        return torch.from_numpy(pixels).permute(2, 0, 1)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_decoder"] = None
        if isinstance(state["_decoder_choice"], Decoder):
            state["_decoder_choice"] = state["_decoder_choice"].name
        return state
