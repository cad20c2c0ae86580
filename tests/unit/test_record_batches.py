"""What a batch is made of: bytes, tensor count, and whether pin_memory can reach its tensors."""

from __future__ import annotations

from collections import namedtuple

import pytest

torch = pytest.importorskip("torch")
from stallscope.recorder.batches import describe_batch  # noqa: E402
from stallscope.recorder.loader import batch_size_of  # noqa: E402


def test_nested_containers_are_pinnable_and_counted():
    Pair = namedtuple("Pair", "x y")
    batch = {"image": torch.zeros(4, 3, 8, 8, dtype=torch.uint8), "meta": [Pair(torch.zeros(4), torch.ones(4))],
             "names": ["a", "b", "c", "d"]}
    info = describe_batch(batch)
    assert info["tensors"] == 3
    assert info["nbytes"] == 4 * 3 * 8 * 8 + 2 * 4 * 4
    assert info["dtypes"] == {"uint8": 768, "float32": 32}
    assert info["pinnable"] is True


def test_custom_class_without_pin_memory_is_not_pinnable():
    class Batch:
        def __init__(self):
            self.x = torch.zeros(2, 5)

    info = describe_batch(Batch())
    assert info["pinnable"] is False and info["unpinnable"] == ["Batch"]
    assert info["tensors"] == 1 and info["nbytes"] == 40

    class PinnableBatch(Batch):
        def pin_memory(self):
            return self

    assert describe_batch(PinnableBatch())["pinnable"] is True


def test_batch_size_from_first_leaf():
    assert batch_size_of((torch.zeros(7, 3), torch.zeros(7))) == 7
    assert batch_size_of({"ids": torch.zeros(5, 9)}) == 5
    assert batch_size_of(["a", "b", "c"]) == 3
    assert batch_size_of(torch.tensor(3.0)) is None
    assert batch_size_of([torch.tensor(1.0), torch.tensor(2.0)]) == 2  # scalars per sample: the list's length
    assert batch_size_of(([torch.zeros(4, 2)], torch.zeros(4))) == 4  # nested: the walk, not the fast path
    assert batch_size_of(()) == 0 and batch_size_of([]) == 0


class _ListSubclass(list):
    """Not exactly a list: the fast path for tuples and lists skips it, the general walk answers."""


def test_batch_size_fast_path_agrees_with_the_walk():
    """Tuples and lists whose first element is an array take a shortcut; the answer must not change."""
    np = pytest.importorskip("numpy")
    cases = [((np.zeros((6, 2)), np.zeros(6)), 6), ([torch.zeros(3, 1, 1)], 3), ((torch.zeros(0, 5),), 0),
             ([np.float64(1.0), np.float64(2.0)], 2), ([torch.tensor(1.0)] * 5, 5)]
    for batch, expected in cases:
        assert batch_size_of(batch) == expected
        assert batch_size_of(_ListSubclass(batch)) == expected
