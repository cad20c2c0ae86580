"""uint8 collate and device-side normalization; GPU paths skip cleanly without CUDA."""

from __future__ import annotations

import pytest
import torch

from stallscope.data import IMAGENET_MEAN, IMAGENET_STD, DeviceNormalizer, collate_uint8, to_device

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _batch(n: int = 4) -> list[tuple[torch.Tensor, int]]:
    g = torch.Generator().manual_seed(0)
    return [(torch.randint(0, 256, (3, 8, 10), dtype=torch.uint8, generator=g), i % 3) for i in range(n)]


def test_collate_uint8_stacks_images_and_labels():
    images, labels = collate_uint8(_batch())
    assert images.dtype == torch.uint8 and tuple(images.shape) == (4, 3, 8, 10)
    assert images.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(images, torch.stack([t for t, _ in _batch()]))
    assert labels.tolist() == [0, 1, 2, 0] and labels.dtype == torch.int64
    channels_last_view = [(t.permute(1, 2, 0).contiguous().permute(2, 0, 1), y) for t, y in _batch()]
    assert torch.equal(collate_uint8(channels_last_view)[0], images)


def test_collate_rejects_float_input():
    with pytest.raises(TypeError, match="uint8"):
        collate_uint8([(torch.zeros(3, 4, 4), 0)])


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2), (torch.float16, 4e-3)])
def test_device_normalization_equals_totensor_normalize(dtype, tol):
    from torchvision.transforms import Normalize

    images, labels = collate_uint8(_batch())
    out, out_labels = DeviceNormalizer("cpu", dtype=dtype)(images, labels)
    ref = Normalize(IMAGENET_MEAN, IMAGENET_STD)(images.float() / 255.0)
    assert out.dtype == dtype and torch.equal(out_labels, labels)
    assert torch.allclose(out.float(), ref, atol=tol * 3, rtol=tol)


def test_to_device_and_channels_last():
    images, labels = collate_uint8(_batch())
    out, _ = to_device((images, labels), "cpu")
    assert out.dtype == torch.float32 and out.shape == images.shape and out.is_contiguous()
    cl, _ = DeviceNormalizer("cpu", channels_last=True)(images)
    assert cl.is_contiguous(memory_format=torch.channels_last)
    with pytest.raises(TypeError, match="uint8"):
        DeviceNormalizer("cpu")(images.float())


@cuda
@pytest.mark.gpu
def test_cuda_transfer_is_pinned_and_normalized_on_the_device():
    images, labels = collate_uint8(_batch())
    out, out_labels = DeviceNormalizer("cuda", dtype=torch.bfloat16)(images.pin_memory(), labels.pin_memory())
    assert out.is_cuda and out.dtype == torch.bfloat16 and out_labels.is_cuda
    ref, _ = DeviceNormalizer("cpu")(images)
    assert torch.allclose(out.float().cpu(), ref, atol=0.05)


@cuda
@pytest.mark.gpu
def test_a_batch_already_on_the_gpu_is_normalized_where_it_is():
    """decode_jpegs_on_gpu's output is on the GPU already: nothing to pin (pinning a CUDA tensor raises)."""
    images, labels = collate_uint8(_batch())
    out, out_labels = DeviceNormalizer("cuda")(images.cuda(), labels.cuda())
    ref, _ = DeviceNormalizer("cpu")(images)
    assert out.is_cuda and out_labels.is_cuda and torch.allclose(out.cpu(), ref, atol=1e-5)


@cuda
@pytest.mark.gpu
def test_nvjpeg_decode_matches_cpu_decode():
    import io

    import numpy as np
    from PIL import Image

    from stallscope.data import decode_jpegs_on_gpu

    arr = (np.arange(64 * 48 * 3) % 251).astype(np.uint8).reshape(48, 64, 3)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="JPEG", quality=95)
    (gpu,) = decode_jpegs_on_gpu([buf.getvalue()])
    cpu = torch.from_numpy(np.asarray(Image.open(io.BytesIO(buf.getvalue())).convert("RGB"))).permute(2, 0, 1)
    assert gpu.is_cuda and (gpu.cpu().int() - cpu.int()).abs().float().mean() < 3


def test_cpu_normalizer_never_overwrites_a_batch_still_held():
    """The reused host buffer is only handed out again once nothing refers to its memory."""
    norm = DeviceNormalizer("cpu")
    a, b = collate_uint8(_batch())[0], collate_uint8(_batch()[::-1])[0]
    ref_b = norm(b)[0].clone()
    holds = {
        "tensor": lambda out: out,
        "view": lambda out: out[1:],
        "numpy array": lambda out: out.numpy(),
        "storage": lambda out: out.untyped_storage(),
        "autograd graph": lambda out: (out.requires_grad_() * 2).sum(),
    }
    for name, hold in holds.items():
        first, _ = norm(a)
        held_memory = first.data_ptr()
        kept = hold(first)
        del first
        for _ in range(3):
            again, _ = norm(b)
            assert again.data_ptr() != held_memory, f"buffer reused while its {name} is held"
            assert torch.equal(again, ref_b)
            del again
        del kept
        reused_before = norm._host_outputs.reused
        out, _ = norm(b)  # nothing holds any earlier batch now: a buffer is reused
        assert torch.equal(out, ref_b) and norm._host_outputs.reused == reused_before + 1, name
        del out


def test_held_batch_keeps_its_values():
    norm = DeviceNormalizer("cpu")
    a, b = collate_uint8(_batch())[0], collate_uint8(_batch()[::-1])[0]
    first, _ = norm(a)
    expected = first.clone()
    for _ in range(6):
        norm(b)
    assert torch.equal(first, expected)
