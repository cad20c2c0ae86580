"""FastImageFolder: same classes and samples as torchvision's ImageFolder, uint8 CHW output."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from stallscope.data import (
    FastImageFolder,
    FullImage,
    RandomResizedCrop,
    ResizeCenterCrop,
    SourceError,
)
from stallscope.demo.dataset import DatasetSpec, make_dataset


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("folder") / "imgs", DatasetSpec(n_files=40, width=200, height=160))


def test_same_classes_and_samples_as_torchvision(folder):
    from torchvision.datasets import ImageFolder

    ours, theirs = FastImageFolder(folder), ImageFolder(folder)
    assert ours.classes == theirs.classes
    assert ours.class_to_idx == theirs.class_to_idx
    assert ours.samples == theirs.samples
    assert ours.targets == theirs.targets


def test_items_are_uint8_chw_at_the_crop_size(folder):
    ds = FastImageFolder(folder, crop=RandomResizedCrop((96, 128)))
    image, label = ds[3]
    assert image.dtype == torch.uint8 and tuple(image.shape) == (3, 96, 128)
    assert label == ds.targets[3]
    image, _ = FastImageFolder(folder, crop=ResizeCenterCrop(80, 64))[0]
    assert tuple(image.shape) == (3, 64, 64)
    image, _ = FastImageFolder(folder, crop=FullImage())[0]
    assert image.shape[0] == 3 and image.shape[1] > 100


def test_center_crop_is_close_to_torchvision_pixels(folder):
    from torchvision import transforms as T
    from torchvision.datasets import ImageFolder

    ours = FastImageFolder(folder, crop=ResizeCenterCrop(128, 112))
    theirs = ImageFolder(folder, T.Compose([T.Resize(128), T.CenterCrop(112), T.PILToTensor()]))
    # Cropping before resizing aligns the box to source pixels, not resized ones: a sub-pixel
    # shift that shows on textured photos. It must stay far below the gap to a wrong image.
    for i in (0, 7, 19):
        diff = (ours[i][0].int() - theirs[i][0].int()).abs().float().mean().item()
        wrong = (ours[i][0].int() - theirs[i + 1][0].int()).abs().float().mean().item()
        assert diff < 12.0 and diff < wrong / 2, (diff, wrong)


def test_decoder_choice_is_reported(folder):
    assert FastImageFolder(folder, decoder="pillow").decoder_name == "pillow"
    with pytest.raises(ValueError, match="unknown decoder"):
        FastImageFolder(folder, decoder="nope")


@pytest.mark.parametrize("first_line", ["# path,label", "path,label", "filename,class"])
def test_file_list_variant(folder, tmp_path, first_line):
    """A comment or a header line (one word per column, naming no file) is not taken for a missing file."""
    ref = FastImageFolder(folder)
    lines = [f"{path},{ref.classes[label]}" for path, label in ref.samples[:10]]
    (tmp_path / "list.csv").write_text(first_line + "\n" + "\n".join(lines) + "\n")
    ds = FastImageFolder.from_file_list(tmp_path / "list.csv")
    assert len(ds) == 10 and ds.samples[0][0] == ref.samples[0][0]
    assert ds[0][0].dtype == torch.uint8


def test_a_first_line_naming_a_missing_file_is_a_row_not_a_header(tmp_path):
    from stallscope.data.sources import read_file_list

    (tmp_path / "list.csv").write_text("gone.jpg,cat\nthere.jpg,dog\n")
    assert [p.name for p, _ in read_file_list(tmp_path / "list.csv").samples] == ["gone.jpg", "there.jpg"]


def test_bad_roots_raise_clear_errors(tmp_path):
    with pytest.raises(SourceError, match="no such folder"):
        FastImageFolder(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceError, match="no class folders"):
        FastImageFolder(tmp_path / "empty")
    (tmp_path / "empty" / "cls").mkdir()
    with pytest.raises(SourceError, match="no images"):
        FastImageFolder(tmp_path / "empty")


def _decoders():
    from stallscope.data import available_decoders

    return available_decoders()


@pytest.mark.parametrize("decoder", _decoders())
def test_batched_fetch_equals_item_by_item_and_collates_without_a_copy(folder, decoder):
    from torch.utils.data import default_collate

    from stallscope.data import collate_uint8

    ds = FastImageFolder(folder, crop=ResizeCenterCrop(80, 64), decoder=decoder)
    indices = [5, 0, 17, 3]
    batch = ds.__getitems__(indices)
    single = [ds[i] for i in indices]
    assert [label for _, label in batch] == [label for _, label in single]
    assert all(torch.equal(a, b) for (a, _), (b, _) in zip(batch, single))
    images, labels = collate_uint8(batch)
    assert images.data_ptr() == batch[0][0].data_ptr()  # the batch was decoded in place: no stacking copy
    assert torch.equal(images, collate_uint8(single)[0]) and labels.tolist() == [y for _, y in single]
    assert torch.equal(default_collate(batch)[0], images)  # any collate function still works
    reordered, _ = collate_uint8(batch[::-1])  # no longer the buffer's order: stacked, correctly
    assert reordered.data_ptr() != images.data_ptr() and torch.equal(reordered, images.flip(0))


def test_batched_fetch_of_differently_sized_images(folder):
    ds = FastImageFolder(folder, crop=FullImage())
    batch = ds.__getitems__([0, 1, 2])
    assert all(torch.equal(image, ds[i][0]) for i, (image, _) in enumerate(batch))


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_worker_batches_equal_item_by_item(folder, start_method):
    from torch.utils.data import DataLoader

    from stallscope.data import collate_uint8

    ds = FastImageFolder(folder, crop=ResizeCenterCrop(72, 64))
    loader = DataLoader(ds, batch_size=6, num_workers=2, collate_fn=collate_uint8,
                        multiprocessing_context=start_method)
    for k, (images, labels) in enumerate(loader):
        ref_images, ref_labels = collate_uint8([ds[i] for i in range(6 * k, min(6 * k + 6, len(ds)))])
        assert torch.equal(images, ref_images) and torch.equal(labels, ref_labels)
    assert k == (len(ds) - 1) // 6


class _ReportsReuse(FastImageFolder):
    """Labels replaced by how many batches this worker's pool has reused so far."""

    def __getitems__(self, indices):
        from stallscope.data._shared_batches import current_pool

        samples = super().__getitems__(indices)
        pool = current_pool()
        return [(image, pool.reused if pool is not None else -1) for image, _ in samples]


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_recycled_worker_batches_are_never_overwritten_while_held(folder, start_method):
    """Workers reuse a batch's shared memory only after the training process dropped it."""
    from torch.utils.data import DataLoader

    from stallscope.data import collate_uint8

    crop = ResizeCenterCrop(72, 64)
    reference = FastImageFolder(folder, crop=crop)
    expected = [collate_uint8([reference[i] for i in range(8 * k, 8 * k + 8)])[0] for k in range(len(reference) // 8)]
    loader = DataLoader(_ReportsReuse(folder, crop=crop), batch_size=8, num_workers=2, collate_fn=collate_uint8,
                        multiprocessing_context=start_method, persistent_workers=True, drop_last=True)
    held, reuse_counts = [], []
    for epoch in range(4):
        for k, (images, reused) in enumerate(loader):
            assert torch.equal(images, expected[k])
            reuse_counts.append(int(reused.max()))
            if epoch == 0 and k in (0, 3):
                held.append((k, images[1:]))  # a view keeps the whole buffer in use
    for k, view in held:  # every later batch was written while these were held: none into them
        assert torch.equal(view, expected[k][1:]), k
    assert max(reuse_counts) > 0  # and buffers the loop had dropped were reused
    del loader


def test_recycling_can_be_turned_off(folder):
    from torch.utils.data import DataLoader

    from stallscope.data import collate_uint8

    ds = _ReportsReuse(folder, crop=ResizeCenterCrop(72, 64), recycle_batches=False)
    loader = DataLoader(ds, batch_size=8, num_workers=1, collate_fn=collate_uint8)
    assert {int(reused.max()) for _ in range(2) for _, reused in loader} == {-1}


def test_a_batch_forwarded_to_another_process_is_never_recycled(folder):
    """Pickling a received batch again (a queue to a third process) cancels its release to the pool."""
    from multiprocessing.reduction import ForkingPickler

    from torch.utils.data import DataLoader

    from stallscope.data import collate_uint8

    crop = ResizeCenterCrop(72, 64)
    loader = DataLoader(_ReportsReuse(folder, crop=crop), batch_size=8, num_workers=1, collate_fn=collate_uint8,
                        persistent_workers=True, drop_last=True, shuffle=True)  # refills differ from the batch
    batches = iter(loader)
    images, _ = next(batches)
    expected = images.clone()
    forwarded = ForkingPickler.dumps(images)  # sent on; the third process reads it only later
    del images
    reuse = []
    for _ in range(3):
        reuse += [int(reused.max()) for _, reused in batches]
        batches = iter(loader)
    assert max(reuse) > 0  # the pool did recycle other buffers meanwhile
    assert torch.equal(ForkingPickler.loads(forwarded), expected)
    del batches, loader


def test_default_collate_gives_the_same_batches_and_workers_keep_recycling(folder):
    """``FastImageFolder(root)`` with the DataLoader's default collate, the first thing people try.

    It measured within 20% of ``collate_fn=collate_uint8`` (``benchmarks/fastpath.py --sizes``: 0.89-1.0x), so
    it is left fast rather than warned about. What keeps it fast, checked here without a clock: the batches are
    the same uint8 NCHW pixels, DeviceNormalizer takes them, and the workers still decode into recycled buffers
    (default_collate copies out of them, so each is free again at once).
    """
    from torch.utils.data import DataLoader, default_collate

    from stallscope.data import DeviceNormalizer, collate_uint8

    crop = ResizeCenterCrop(72, 64)
    reference = FastImageFolder(folder, crop=crop)
    normalize = DeviceNormalizer("cpu")
    loader = DataLoader(_ReportsReuse(folder, crop=crop), batch_size=8, num_workers=1, persistent_workers=True,
                        drop_last=True)
    reuse = []
    for _ in range(2):
        for k, (images, reused) in enumerate(loader):
            expected = collate_uint8([reference[i] for i in range(8 * k, 8 * k + 8)])[0]
            assert images.dtype == torch.uint8 and torch.equal(images, expected)
            assert torch.equal(normalize(images)[0], normalize(expected)[0])
            reuse.append(int(reused.max()))
    assert max(reuse) > 0
    in_process = default_collate(reference.__getitems__(list(range(8))))[0]  # num_workers=0
    assert torch.equal(in_process, collate_uint8([reference[i] for i in range(8)])[0])
    del loader


def test_a_class_folder_that_cannot_be_read_is_an_error_not_a_silent_gap(tmp_path):
    """os.walk skips a folder it cannot list without a word: its images would be missing from the dataset and
    from a pack. As root nothing is unreadable, so there the listing runs as an unprivileged user (setpriv)."""
    import os
    import shutil
    import subprocess
    import sys
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="stallscope-unreadable-", dir="/tmp"))
    try:
        for name in ("a", "b"):
            (root / name).mkdir()
            (root / name / "x.jpg").write_bytes(b"\xff\xd8\xff")
        os.chmod(root, 0o755)
        os.chmod(root / "a", 0o755)
        os.chmod(root / "b", 0)
        probe = ("import sys\nfrom stallscope.data.sources import SourceError, list_image_folder\n"
                 f"try:\n    list_image_folder({str(root)!r})\nexcept SourceError as exc:\n    print(exc); sys.exit(3)\n")
        if os.geteuid() != 0:
            command = [sys.executable, "-c", probe]
        elif shutil.which("setpriv"):
            command = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", sys.executable, "-c", probe]
        else:
            pytest.skip("running as root without setpriv: nothing can be made unreadable")
        src = str(Path(__file__).resolve().parents[2] / "src")
        done = subprocess.run(command, capture_output=True, text=True, timeout=60,
                              env={**os.environ, "PYTHONPATH": src}, cwd="/")
        if done.returncode != 3 and "Permission denied" not in done.stdout and os.geteuid() == 0:
            pytest.skip(f"the unprivileged user could not run the probe here: {done.stderr[-300:]}")
        assert done.returncode == 3, done.stdout + done.stderr
        assert f"{root / 'b'}: cannot read this folder (Permission denied); its images would be left out" in done.stdout
    finally:
        os.chmod(root / "b", 0o755)
        shutil.rmtree(root, ignore_errors=True)
