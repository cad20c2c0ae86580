"""What ``pack --max-side auto`` is predicted to store, before it starts: from a sample of the source's headers,
with a few of the images it shrinks re-encoded and decoded as the pack and the training will."""

from __future__ import annotations

import io
from dataclasses import dataclass

from stallscope.data.crop_fit import CropFit
from stallscope.data.packing.prepare import shrink


@dataclass(frozen=True)
class AutoPackEstimate:
    """What ``pack --max-side auto`` is predicted to store, from a sample of the source."""
    sampled: int
    shrunk: int  # of the sampled, the images stored smaller
    pixels_kept: float  # the packed pixels over the originals', over the sample
    original_bytes: int  # the whole source, estimated from the sample's mean
    packed_bytes: int  # likewise, with the shrunk images' bytes as re-encoding a few of them measured
    decode_ms: tuple[float, float] | None  # a full decode (Pillow) of the measured images, original and packed


def estimate(paths: list[str], fit: CropFit, total: int, quality: int = 90, sample: int = 200,
             measured: int = 12) -> AutoPackEstimate:
    """The auto-sized pack of ``total`` images, predicted from up to ``sample`` of ``paths`` spread over the list:
    each one's header gives its size, its file its bytes. ``measured`` of the images to shrink are re-encoded as the
    pack will (at ``quality``) and both versions decoded: their bytes per pixel, packed against original, scale the
    other shrunk images' bytes, and their decode times are the prediction's."""
    import time

    from PIL import Image

    from stallscope.data.headers import HeaderError, read_header

    step = max(1, len(paths) // sample) if paths else 1
    chosen = paths[::step][:sample]
    pixels = kept = original = unchanged = shrunk_naive = 0.0
    read = shrunk = 0
    trials: list[tuple[float, int, float, float]] = []  # naive bytes, re-encoded bytes, decode s (orig., packed)

    def decode_s(data: bytes) -> float:
        began = time.perf_counter()
        with Image.open(io.BytesIO(data)) as im:
            im.load()
        return time.perf_counter() - began

    for path in chosen:
        try:
            with open(path, "rb") as f:
                data = f.read()
            header = read_header(data)
        except (OSError, HeaderError):
            continue
        width, height = header.width, header.height
        longer = max(width, height)
        side = fit.longer_side(width, height)
        fraction = (side / longer) ** 2 if side < longer else 1.0
        read += 1
        pixels += width * height
        kept += width * height * fraction
        original += len(data)
        if side >= longer:
            unchanged += len(data)
            continue
        shrunk += 1
        shrunk_naive += len(data) * fraction
        if len(trials) < measured:
            try:
                packed_data = shrink(data, side, quality)[0]
                trials.append((len(data) * fraction, len(packed_data), decode_s(data), decode_s(packed_data)))
            except Exception:  # noqa: BLE001, S112 - an image the pack will report as bad: left out here
                continue
    correction = sum(t[1] for t in trials) / sum(t[0] for t in trials) if trials else 1.0
    scale = total / read if read else 0.0
    packed = (unchanged + correction * shrunk_naive) * scale
    decode = (sum(t[2] for t in trials) / len(trials) * 1e3, sum(t[3] for t in trials) / len(trials) * 1e3) \
        if trials else None
    return AutoPackEstimate(read, shrunk, kept / pixels if pixels else 1.0, int(original * scale), int(packed),
                            decode)
