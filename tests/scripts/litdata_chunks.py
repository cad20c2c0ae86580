"""A job that streams LitData chunks from an S3 bucket, as Lightning users at scale do:
``python litdata_chunks.py write IMAGE_FOLDER OUT --chunk-bytes N`` packs a class-per-folder JPEG tree into LitData
chunks (``litdata.optimize``); ``python litdata_chunks.py train s3://BUCKET/PREFIX`` trains from them, the endpoint
and keys from the usual AWS environment, LitData downloading its chunks on its own thread (through obstore, the
Rust client, where it can) into a fresh local cache.
"""

import argparse
import io
import os
import sys
import tempfile
from pathlib import Path

import litdata
import litdata.streaming.downloader
import torch
from PIL import Image
from torch.utils.data import DataLoader
from torchvision import transforms

# LitData builds obstore's client with options of its own, and obstore refuses a plain-HTTP endpoint unless told;
# the test's S3 server speaks plain HTTP on loopback (a real bucket is https). At module level, so a spawned worker,
# which imports this script again, sets it too.
_OPTIONS = getattr(litdata.streaming.downloader, "_OBSTORE_CLIENT_OPTIONS", None)
if isinstance(_OPTIONS, dict):
    _OPTIONS["allow_http"] = True

def _record(item: tuple[str, int]) -> dict:
    path, label = item
    return {"jpg": Path(path).read_bytes(), "cls": label}


def write(folder: Path, out: Path, chunk_bytes: int) -> int:
    classes = sorted(p.name for p in folder.iterdir() if p.is_dir())
    items = [(str(path), label) for label, name in enumerate(classes) for path in sorted((folder / name).glob("*.jpg"))]
    litdata.optimize(fn=_record, inputs=items, output_dir=str(out), chunk_bytes=chunk_bytes, num_workers=1,
                     mode="overwrite")
    return 0


class Images(litdata.StreamingDataset):
    crop = transforms.Compose([transforms.RandomResizedCrop(96), transforms.ToTensor()])

    def __getitem__(self, index):
        record = super().__getitem__(index)
        return self.crop(Image.open(io.BytesIO(bytes(record["jpg"]))).convert("RGB")), int(record["cls"])


def train(remote: str, workers: int, batch_size: int, steps: int, max_pre_download: int | None,
          context: str | None) -> int:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as cache:
        options = {"endpoint_url": os.environ["AWS_ENDPOINT_URL"]} if os.environ.get("AWS_ENDPOINT_URL") else {}
        extra = {"max_pre_download": max_pre_download} if max_pre_download is not None else {}
        dataset = Images(remote, cache_dir=cache, shuffle=True, seed=1, storage_options=options, **extra)
        loader = DataLoader(dataset, batch_size=batch_size, num_workers=workers, multiprocessing_context=context)
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=2), torch.nn.ReLU(),
                                    torch.nn.AdaptiveAvgPool2d(4), torch.nn.Flatten(), torch.nn.Linear(128, 10))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        step = 0
        while step < steps:
            for images, labels in loader:
                loss = torch.nn.functional.cross_entropy(model(images), labels % 10)
                opt.zero_grad()
                loss.backward()
                opt.step()
                step += 1
                if step >= steps:
                    break
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="verb", required=True)
    writing = sub.add_parser("write")
    writing.add_argument("folder", type=Path)
    writing.add_argument("out", type=Path)
    writing.add_argument("--chunk-bytes", type=int, default=1 << 26)
    training = sub.add_parser("train")
    training.add_argument("remote")
    training.add_argument("--workers", type=int, default=2)
    training.add_argument("--batch-size", type=int, default=16)
    training.add_argument("--steps", type=int, default=100000)
    training.add_argument("--max-pre-download", type=int, default=None)
    training.add_argument("--context", default=None, help="the workers' multiprocessing context (fork, spawn)")
    args = parser.parse_args()
    if args.verb == "write":
        return write(args.folder, args.out, args.chunk_bytes)
    return train(args.remote, args.workers, args.batch_size, args.steps, args.max_pre_download, args.context)


if __name__ == "__main__":
    sys.exit(main())
