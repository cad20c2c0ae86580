"""Which library calls count as which node, and the patches that time them.

Decoders (Pillow's open/load, its convert of an image still to decode, OpenCV's imread/imdecode,
torchvision.io, simplejpeg, numpy/torch deserialization) are ``decode``; image operations (a convert of
decoded pixels among them) and every torchvision transform are ``transform``; ``collate`` is timed by the
fetch wrapper as ``loader``. CPU time spent in none of these (the dataset's own Python code, tokenizers) is
charged to ``transform`` by the analysis, and off-CPU time to ``storage``.
"""

from __future__ import annotations

import inspect
from typing import Any

from stallscope.recorder.calls import (
    DECODED_CONVERT,
    patch_module_functions,
    timed_call,
    timed_method,
    timed_method_by_state,
)

#: Container transforms run their children; timing them would hide the children's names.
_CONTAINERS = {"Compose", "RandomApply", "RandomChoice", "RandomOrder", "Transform"}


def _convert_stage(image: Any) -> tuple[str, str]:
    """``Image.convert`` decodes an image still to be decoded (an opened file's ``tile`` lists what is left to
    decode: torchvision's loader converts right after ``open``), so it is decode; of pixels already decoded it is a
    transform's pixel conversion."""
    return ("decode", "Image.convert") if getattr(image, "tile", None) else ("transform", DECODED_CONVERT)


def patch_pil_image(module: Any) -> None:
    module.open = timed_call(module.open, "decode", "PIL.Image.open")
    image_cls = module.Image
    timed_method_by_state(image_cls, "convert", _convert_stage)
    for name in ("resize", "crop", "transpose", "rotate", "transform", "filter", "reduce", "thumbnail"):
        timed_method(image_cls, name, "transform", label_from_instance=False)


def patch_pil_imagefile(module: Any) -> None:
    timed_method(module.ImageFile, "load", "decode", label_from_instance=False)


def patch_cv2(module: Any) -> None:
    patch_module_functions(module, ("imread", "imdecode", "imreadmulti"), "decode", "cv2.")
    patch_module_functions(module, ("resize", "cvtColor", "warpAffine", "warpPerspective", "GaussianBlur", "blur",
                                    "flip", "rotate", "copyMakeBorder", "normalize", "remap", "medianBlur",
                                    "filter2D", "equalizeHist", "convertScaleAbs", "LUT"), "transform", "cv2.")


def patch_simplejpeg(module: Any) -> None:
    patch_module_functions(module, ("decode_jpeg",), "decode", "simplejpeg.")


def patch_stallscope_turbo(module: Any) -> None:
    """stallscope's own fast path decodes through libjpeg-turbo's TurboJPEG API (``data/turbo.py``)."""
    patch_module_functions(module, ("decode_jpeg",), "decode", "turbojpeg.")


def patch_torchvision_io(module: Any) -> None:
    patch_module_functions(module, ("decode_jpeg", "decode_png", "decode_image", "decode_webp", "decode_gif",
                                    "decode_avif", "decode_heic", "read_image"), "decode", "torchvision.io.")
    patch_module_functions(module, ("read_file",), "storage", "torchvision.io.")


def _patch_transform_classes(module: Any) -> int:
    """Time every transform class defined in ``module`` by its instance's class name."""
    import torch

    count = 0
    for name, cls in vars(module).items():
        if not isinstance(cls, type) or name in _CONTAINERS or name.startswith("_"):
            continue
        if cls.__module__ != module.__name__:
            continue
        if issubclass(cls, torch.nn.Module):
            count += timed_method(cls, "forward", "transform")
        else:
            count += timed_method(cls, "__call__", "transform")
    return count


def patch_transforms_v1(module: Any) -> None:
    _patch_transform_classes(module)


def patch_transforms_v2(module: Any) -> None:
    import torch

    # v2 transforms live in private submodules; walk the public namespace and patch where defined.
    seen: set[type] = set()
    for name, cls in vars(module).items():
        if not isinstance(cls, type) or name in _CONTAINERS or not issubclass(cls, torch.nn.Module):
            continue
        for klass in cls.__mro__:
            if klass in seen or klass.__module__.split(".")[:3] != ["torchvision", "transforms", "v2"]:
                continue
            seen.add(klass)
            if klass.__name__ not in _CONTAINERS:
                timed_method(klass, "forward", "transform")
    transform_base = getattr(module, "Transform", None)
    if transform_base is not None:
        timed_method(transform_base, "forward", "transform")


def _public_functions(module: Any) -> list[str]:
    return [n for n, f in vars(module).items()
            if not n.startswith("_") and inspect.isfunction(f) and f.__module__.startswith("torchvision.")]


def patch_functional_v1(module: Any) -> None:
    """v1 functionals only: v2 transforms look their kernels up by the functional object itself,
    so wrapping ``torchvision.transforms.v2.functional`` would break them."""
    patch_module_functions(module, _public_functions(module), "transform", "F.")


def patch_numpy(module: Any) -> None:
    patch_module_functions(module, ("load",), "decode", "numpy.")


def patch_torch(module: Any) -> None:
    patch_module_functions(module, ("load",), "decode", "torch.")


def patch_lmdb(module: Any) -> None:
    """Remember which process opened which LMDB environment: one opened before a fork is shared by workers."""
    import functools
    import os
    import time

    from stallscope.recorder import events

    original = module.open

    @functools.wraps(original)
    def open_env(path: Any, *args: Any, **kwargs: Any) -> Any:
        events.emit("lmdb_open", os.getpid(), time.perf_counter_ns(), str(path))
        return original(path, *args, **kwargs)

    module.open = open_env  # lmdb.Environment itself stays the class, for isinstance checks


#: module name -> patch, applied right after that module is imported.
LIBRARY_PATCHES: dict[str, Any] = {
    "PIL.Image": patch_pil_image,
    "PIL.ImageFile": patch_pil_imagefile,
    "cv2": patch_cv2,
    "simplejpeg": patch_simplejpeg,
    "stallscope.data.turbo": patch_stallscope_turbo,
    "torchvision.io": patch_torchvision_io,
    "torchvision.transforms.transforms": patch_transforms_v1,
    "torchvision.transforms.functional": patch_functional_v1,
    "torchvision.transforms.v2": patch_transforms_v2,
    "numpy": patch_numpy,
    "lmdb": patch_lmdb,
}
