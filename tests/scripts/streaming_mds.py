"""A job that streams MosaicML Streaming (MDS) shards from an S3 bucket, as jobs at scale do:
``python streaming_mds.py write IMAGE_FOLDER OUT --size-limit BYTES`` packs a class-per-folder JPEG tree into MDS
shards; ``python streaming_mds.py train s3://BUCKET/PREFIX`` trains from them, the endpoint and keys from the usual
AWS environment (``S3_ENDPOINT_URL`` is Streaming's own name for the endpoint), each DataLoader worker downloading
its shards on Streaming's own thread into a fresh local cache.
"""

import argparse
import contextlib
import io
import sys
import tempfile
from pathlib import Path

import torch
from PIL import Image
from streaming import MDSWriter, StreamingDataset
from torch.utils.data import DataLoader
from torchvision import transforms


def write(folder: Path, out: Path, size_limit: int) -> int:
    classes = sorted(p.name for p in folder.iterdir() if p.is_dir())
    with MDSWriter(out=str(out), columns={"jpg": "bytes", "cls": "int"}, size_limit=size_limit,
                   hashes=["xxh64"]) as writer:
        for label, name in enumerate(classes):
            for path in sorted((folder / name).glob("*.jpg")):
                writer.write({"jpg": path.read_bytes(), "cls": label})
    return 0


class Images(StreamingDataset):
    crop = transforms.Compose([transforms.RandomResizedCrop(96), transforms.ToTensor()])

    def __getitem__(self, index):
        record = super().__getitem__(index)
        return self.crop(Image.open(io.BytesIO(record["jpg"])).convert("RGB")), record["cls"]


def train(remote: str, workers: int, batch_size: int, steps: int, predownload: int | None,
          cache: str | None, persistent: bool = False, validate: bool = False,
          cache_limit: int | None = None) -> int:
    torch.set_num_threads(1)
    with (contextlib.nullcontext(cache) if cache else tempfile.TemporaryDirectory(ignore_cleanup_errors=True)) as local:
        dataset = Images(remote=remote, local=local, batch_size=batch_size, shuffle=True, shuffle_seed=1,
                         predownload=predownload, validate_hash="xxh64" if validate else None,
                         cache_limit=cache_limit)
        loader = DataLoader(dataset, batch_size=batch_size, num_workers=workers,
                            persistent_workers=persistent and workers > 0)
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
    writing.add_argument("--size-limit", type=int, default=1 << 26)
    training = sub.add_parser("train")
    training.add_argument("remote")
    training.add_argument("--workers", type=int, default=2)
    training.add_argument("--batch-size", type=int, default=16)
    training.add_argument("--steps", type=int, default=100000)
    training.add_argument("--predownload", type=int, default=None)
    training.add_argument("--persistent-workers", action="store_true")
    training.add_argument("--cache-limit", type=int, default=None, help="bytes the local cache may hold")
    training.add_argument("--validate", action="store_true", help="check each downloaded shard's xxh64")
    training.add_argument("--cache", help="the local cache, kept after the run (default: a temporary folder)")
    args = parser.parse_args()
    if args.verb == "write":
        return write(args.folder, args.out, args.size_limit)
    return train(args.remote, args.workers, args.batch_size, args.steps, args.predownload, args.cache,
                 args.persistent_workers, args.validate, args.cache_limit)


if __name__ == "__main__":
    sys.exit(main())
