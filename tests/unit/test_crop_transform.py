"""The crop a training's transform takes, read from the dataset, and the pack command the decode advice names."""

from __future__ import annotations

import pytest
from torch.utils.data import ConcatDataset, Dataset, Subset

from stallscope.recorder.crop_transform import training_crop
from stallscope.render.words.recommendations import pack_auto_flags

T = pytest.importorskip("torchvision.transforms")


class Folder(Dataset):
    """Stands for an ImageFolder: a transform attribute, items never read."""

    def __init__(self, transform):
        self.transform = transform

    def __len__(self):
        return 4

    def __getitem__(self, i):
        raise AssertionError("the crop is read without loading an item")


def test_torchvisions_random_resized_crop_is_read_through_wrappers():
    train = Folder(T.Compose([T.RandomResizedCrop(176, scale=(0.35, 1.0)), T.RandomHorizontalFlip(), T.ToTensor()]))
    expected = {"kind": "RandomResizedCrop", "size": [176, 176], "scale": [0.35, 1.0], "ratio": [0.75, 4 / 3]}
    assert training_crop(train) == expected
    assert training_crop(Subset(train, [0, 1])) == expected
    assert training_crop(ConcatDataset([train, Folder(None)])) == expected
    assert pack_auto_flags(expected) == " --crop 176 --crop-scale 0.35"


def test_torchvision_v2_and_an_evaluation_resize_then_center_crop():
    v2 = pytest.importorskip("torchvision.transforms.v2")
    crop = training_crop(Folder(v2.Compose([v2.RandomResizedCrop((160, 192), ratio=(0.5, 2.0)), v2.ToImage()])))
    assert crop == {"kind": "RandomResizedCrop", "size": [160, 192], "scale": [0.08, 1.0], "ratio": [0.5, 2.0]}
    assert pack_auto_flags(crop) == " --crop 192 --crop-ratio 0.5 2"  # pack's crop is square: the longer side
    evaluation = training_crop(Folder(T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor()])))
    assert evaluation == {"kind": "Resize", "resize_shorter": 256}
    assert pack_auto_flags(evaluation) == " --resize-shorter 256"


def test_stallscopes_own_crops_and_nothing_where_no_crop_is_taken():
    from stallscope.data.crops import RandomResizedCrop, ResizeCenterCrop

    class Fast(Dataset):
        def __init__(self, crop):
            self.crop = crop

    assert training_crop(Fast(RandomResizedCrop(224)))["scale"] == [0.08, 1.0]
    assert pack_auto_flags(training_crop(Fast(RandomResizedCrop(224)))) == ""  # torchvision's defaults: no flags
    assert training_crop(Fast(ResizeCenterCrop(292, 256))) == {"kind": "Resize", "resize_shorter": 292}
    assert training_crop(Folder(T.Compose([T.Resize(256), T.ToTensor()]))) is None  # no crop after the resize
    assert training_crop(Folder(lambda image: image)) is None
    assert training_crop(range(10)) is None
    assert pack_auto_flags(None) == ""


def test_the_decode_advice_names_the_pack_command_for_the_runs_crop():
    from stallscope.analysis.findings import Recommendation
    from stallscope.render.words.recommendations import recommendation

    crop = {"kind": "RandomResizedCrop", "size": [176, 176], "scale": [0.35, 1.0], "ratio": [0.75, 4 / 3]}
    said = recommendation(Recommendation("reduced-size-decode", "decode", 1.3, facts={"share": 0.4, "crop": crop}))
    assert "`stallscope pack SRC OUT --max-side auto --crop 176 --crop-scale 0.35`" in said.change
    assert "RandomResizedCrop(176, scale=(0.35, 1), ratio=(0.75, 1.33))" in said.change
    plain = recommendation(Recommendation("reduced-size-decode", "decode", 1.3, facts={"share": 0.4}))
    assert "`stallscope pack SRC OUT --max-side auto`" in plain.change


def test_the_dataset_is_read_without_running_its_code():
    """Properties and __getattr__ of a user's dataset are never called: one that opens a database lazily must not
    do it in the training process before the workers fork."""
    calls = []

    class Lazy(Dataset):
        @property
        def transform(self):
            calls.append("transform")
            return T.Compose([T.RandomResizedCrop(128)])

        def __getattr__(self, name):
            calls.append(name)
            raise AttributeError(name)

    assert training_crop(Lazy()) is None and calls == []
