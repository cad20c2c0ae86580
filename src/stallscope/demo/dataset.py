"""An ImageNet-like JPEG folder made from real photos that ship inside Python packages.

Random crops, flips and colour shifts of real photographs give JPEGs whose decode cost and
entropy resemble ImageNet's far better than noise or flat colours would. The folder is
cached: a second call with the same parameters returns at once.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

MANIFEST = "stallscope-dataset.json"


@dataclass(frozen=True)
class DatasetSpec:
    n_files: int = 2000
    n_classes: int = 10
    width: int = 500
    height: int = 400
    quality_min: int = 75
    quality_max: int = 95
    seed: int = 0
    version: int = 1

    def key(self) -> str:
        return hashlib.sha1(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:10]


def _source_photo_paths() -> list[Path]:
    """Colour photos packaged with scikit-image and scikit-learn (whichever are installed)."""
    found: list[Path] = []
    try:
        import skimage.data

        base = Path(skimage.data.__file__).parent
        for name in ("astronaut.png", "chelsea.png", "coffee.png", "hubble_deep_field.jpg", "ihc.png",
                     "motorcycle_left.png", "motorcycle_right.png", "retina.jpg", "rocket.jpg"):
            if (base / name).is_file():
                found.append(base / name)
    except ImportError:
        pass
    try:
        import sklearn.datasets

        base = Path(sklearn.datasets.__file__).parent / "images"
        found.extend(sorted(base.glob("*.jpg")))
    except ImportError:
        pass
    if not found:
        raise RuntimeError(
            "no packaged sample photos found: install the demo extra (pip install 'stallscope[demo]'), "
            "which brings scikit-image's sample images"
        )
    return found


def _load_photos() -> list[object]:
    from PIL import Image

    photos = []
    for path in _source_photo_paths():
        with Image.open(path) as im:
            photos.append(im.convert("RGB"))
    return photos


def _variants(spec: DatasetSpec, photos: list) -> Iterator[tuple[int, Any, int]]:
    """Yield (class index, image, JPEG quality): a random crop of a random photo, resized near spec size."""
    from PIL import Image, ImageEnhance

    rng = random.Random(spec.seed)
    for i in range(spec.n_files):
        photo = photos[rng.randrange(len(photos))]
        pw, ph = photo.size
        # A crop covering 30-100% of the photo's side, then resized around the target size (+-20%).
        frac = rng.uniform(0.3, 1.0)
        cw, ch = max(16, int(pw * frac)), max(16, int(ph * frac * rng.uniform(0.8, 1.2)))
        ch = min(ch, ph)
        x, y = rng.randrange(0, pw - cw + 1), rng.randrange(0, ph - ch + 1)
        w = int(spec.width * rng.uniform(0.8, 1.2))
        h = int(spec.height * rng.uniform(0.8, 1.2))
        # Image.BILINEAR, Image.FLIP_LEFT_RIGHT: Pillow sets its module aliases at run time, where its stubs do not
        # see them
        img = photo.crop((x, y, x + cw, y + ch)).resize((w, h), Image.BILINEAR)  # type: ignore[attr-defined]
        if rng.random() < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)  # type: ignore[attr-defined]
        img = ImageEnhance.Color(img).enhance(rng.uniform(0.6, 1.4))
        img = ImageEnhance.Brightness(img).enhance(rng.uniform(0.7, 1.3))
        yield i % spec.n_classes, img, rng.randint(spec.quality_min, spec.quality_max)


def make_dataset(root: str | os.PathLike[str], spec: DatasetSpec = DatasetSpec(), progress: bool = False) -> Path:
    """Create (or reuse) an ImageFolder tree ``root/class_XX/img_NNNNN.jpg`` and return its path.

    Files are written under a temporary name and renamed, and the manifest is written last,
    so an interrupted generation is finished, not trusted, on the next call.
    """
    root = Path(root)
    manifest = root / MANIFEST
    if manifest.is_file():
        try:
            if json.loads(manifest.read_text()).get("key") == spec.key():
                return root
        except (OSError, ValueError):
            pass
    root.mkdir(parents=True, exist_ok=True)
    photos = _load_photos()
    total = 0
    for index, (label, img, quality) in enumerate(_variants(spec, photos)):
        class_dir = root / f"class_{label:02d}"
        class_dir.mkdir(exist_ok=True)
        final = class_dir / f"img_{index:05d}.jpg"
        if not final.exists():
            tmp = final.with_suffix(".tmp")
            try:
                img.save(tmp, format="JPEG", quality=quality)
                os.replace(tmp, final)
            except OSError:
                tmp.unlink(missing_ok=True)  # a full disk leaves half a file: take it back, the next call redoes it
                raise
        total += 1
        if progress and total % 250 == 0:
            print(f"  generated {total}/{spec.n_files} JPEGs", flush=True)
    manifest.write_text(json.dumps({"key": spec.key(), "spec": asdict(spec), "files": total}, indent=1))
    return root


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "stallscope" / "datasets"


def demo_dataset(spec: DatasetSpec = DatasetSpec(), progress: bool = False) -> Path:
    """The cached demo dataset for ``spec`` under the user's cache directory."""
    return make_dataset(default_cache_dir() / f"imagefolder-{spec.width}x{spec.height}-{spec.key()}", spec, progress)
