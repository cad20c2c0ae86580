"""The catalogue of fixes: every change stallscope can advise, declared once.

Each fix names the stage it acts on, how it scales that stage's cost in the throughput model (what its
predicted gain is priced from, where a scale can price it), the ``--set`` settings that make it (none for
a change to the code), and whether ``stallscope plan`` prices it on another machine. ``run``'s
recommendations (``recommend.py``, ``ranks.py``) and ``plan``'s fixes are both built from it, so the two
can never price one change two ways. The words for each id are in ``render/words/recommendations.py``;
the docs' findings page has a section per id.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from stallscope.analysis.findings import Recommendation

#: The share of transform time a move of normalization to the GPU can remove at most: the conversion to
#: uint8 and the copy stay on the CPU.
MAX_NORMALIZE_CUT = 0.9
#: The collate share of loader time that sending uint8 (a quarter of float32's bytes) saves.
UINT8_LOADER_SCALE = 0.5


@dataclass(frozen=True)
class Fix:
    """One change: ``stage`` it acts on; ``scale``, the cost factor it puts on the model's stages (empty when its
    gain is priced another way: worker counts, epoch starts, the step's transfer); ``settings``, the ``--set``
    names it may change; ``planned``, priced by ``stallscope plan`` too."""
    id: str
    stage: str
    scale: Mapping[str, float] = field(default_factory=dict)
    settings: tuple[str, ...] = ()
    planned: bool = False

    def scaled(self, normalize_fraction: float = 0.0) -> dict[str, float]:
        """The cost scale on the model's stages. Moving normalization to the GPU removes the run's own share of
        normalizing in the transform stage (``normalize_fraction``), up to ``MAX_NORMALIZE_CUT``."""
        if self.id == "uint8-device-normalize":
            return {"transform": 1 - min(MAX_NORMALIZE_CUT, normalize_fraction), "loader": UINT8_LOADER_SCALE}
        return dict(self.scale)

    def advise(self, gain: float | None, overrides: Mapping[str, Any] | None = None,
               facts: Mapping[str, Any] | None = None) -> Recommendation:
        """This fix as a recommendation of this run: its predicted speedup, the settings to set, the figures."""
        return Recommendation(self.id, self.stage, gain, dict(overrides or {}), dict(facts or {}))


_CATALOGUE = (
    # the workers and their queue
    Fix("num-workers", "loader", settings=("num_workers", "persistent_workers", "prefetch_factor",
                                           "multiprocessing_context")),
    Fix("fewer-workers", "loader", settings=("num_workers",)),
    Fix("persistent-workers", "loader", settings=("persistent_workers",)),
    Fix("build-loader-once", "loader"),
    Fix("prefetch", "loader", settings=("prefetch_factor",)),
    Fix("discarded-prefetch", "loader", settings=("prefetch_factor",)),
    Fix("sharing-strategy", "loader", settings=("sharing_strategy",)),
    Fix("workers-per-node", "loader", settings=("num_workers",)),
    # the stages' own costs, priced by scaling them in the model
    Fix("pack-dataset", "storage", {"storage": 0.3}, planned=True),
    Fix("requests-in-flight", "storage"),  # priced by the requests' own wait (recommend.py)
    Fix("larger-shards", "storage"),  # priced by the requests' latency (recommend.py)
    Fix("reduced-size-decode", "decode", {"decode": 0.5}, planned=True),
    Fix("uint8-device-normalize", "transform", planned=True),
    Fix("cheaper-transforms", "transform", {"transform": 0.5}),
    Fix("dataset-code", "transform", {"transform": 0.5}),
    Fix("cheaper-collate", "loader", {"loader": 0.5}),
    # the copy to the device
    Fix("pin-memory", "transfer", settings=("pin_memory",)),
    # the training process's own threads
    Fix("split-the-cores", "compute", settings=("torch_threads", "num_workers", "persistent_workers")),
    Fix("compute-threads", "compute", settings=("torch_threads",)),
    # inside the step (compute_findings.py): a code change each; numerics without a predicted gain
    Fix("python-in-step", "compute"),
    Fix("optimizer-foreach", "compute"),
    Fix("ddp-find-unused", "compute"),
    Fix("thread-in-step", "compute"),
    Fix("host-bound", "compute"),
    Fix("device-sync", "compute"),
    Fix("allocator", "compute"),
    Fix("ddp-buckets", "sync"),
    Fix("ddp-compress", "sync"),
    Fix("mixed-precision", "compute"),
    Fix("tf32", "compute"),
    Fix("cudnn-benchmark", "compute"),
    Fix("channels-last", "compute"),
    # several processes
    Fix("distributed-sampler", "loader"),
    Fix("sampler-drop-last", "loader"),
    Fix("uneven-shards", "sync"),
    Fix("wait-for-other-nodes", "sync"),
    Fix("straggler-cpus", "sync"),
    # no change to make: what the run showed instead
    Fix("no-input-fix", "compute"),
    Fix("no-predicted-gain", "loader"),
)

#: id -> fix, in the catalogue's order (``plan`` lists its priced fixes in this order before ranking them).
FIXES: Mapping[str, Fix] = MappingProxyType({fix.id: fix for fix in _CATALOGUE})


def advise(fix_id: str, gain: float | None, overrides: Mapping[str, Any] | None = None,
           facts: Mapping[str, Any] | None = None) -> Recommendation:
    """``FIXES[fix_id].advise(...)``: a recommendation whose stage is the catalogue's."""
    return FIXES[fix_id].advise(gain, overrides, facts)


def planned() -> list[Fix]:
    """The fixes ``stallscope plan`` prices on a target machine."""
    return [fix for fix in FIXES.values() if fix.planned]
