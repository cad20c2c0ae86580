"""FastImageFolder: same classes and samples as torchvision's ImageFolder, uint8 CHW output."""

from __future__ import annotations

import pytest
import torch

from stallscope.data import FastImageFolder, FullImage, RandomResizedCrop, ResizeCenterCrop, SourceError
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


def test_file_list_variant(folder, tmp_path):
    ref = FastImageFolder(folder)
    lines = [f"{path},{ref.classes[label]}" for path, label in ref.samples[:10]]
    (tmp_path / "list.csv").write_text("# path,label\n" + "\n".join(lines) + "\n")
    ds = FastImageFolder.from_file_list(tmp_path / "list.csv")
    assert len(ds) == 10 and ds.samples[0][0] == ref.samples[0][0]
    assert ds[0][0].dtype == torch.uint8


def test_bad_roots_raise_clear_errors(tmp_path):
    with pytest.raises(SourceError, match="no such folder"):
        FastImageFolder(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceError, match="no class folders"):
        FastImageFolder(tmp_path / "empty")
    (tmp_path / "empty" / "cls").mkdir()
    with pytest.raises(SourceError, match="no images"):
        FastImageFolder(tmp_path / "empty")
