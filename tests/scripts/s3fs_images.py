"""An ImageNet-style job whose JPEGs live in an S3 bucket, read through fsspec: ``__getitem__`` opens each one with
s3fs (``fs.cat``; the endpoint and keys from the usual AWS environment variables), decodes it with Pillow and crops it
with torchvision.

``--batched`` fetches a batch's objects with one ``fs.cat([paths])`` in the dataset's ``__getitems__``, which s3fs
runs at once on its event loop: the change stallscope advises for a latency-bound store read through fsspec.
"""

import argparse
import io
import os
import sys

import s3fs
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from torchvision import transforms


def filesystem() -> s3fs.S3FileSystem:
    endpoint = os.environ.get("AWS_ENDPOINT_URL")
    return s3fs.S3FileSystem(endpoint_url=endpoint, skip_instance_cache=True) if endpoint else s3fs.S3FileSystem()


class S3fsImages(Dataset):
    def __init__(self, paths: list[str], batched: bool) -> None:
        self.paths, self.batched = paths, batched
        self.fs = None
        self.transform = transforms.Compose([transforms.RandomResizedCrop(96), transforms.ToTensor()])

    def __len__(self) -> int:
        return len(self.paths)

    def _fs(self) -> s3fs.S3FileSystem:
        if self.fs is None:  # one per process: its event loop and connections are not to be shared across a fork
            self.fs = filesystem()
        return self.fs

    def _sample(self, path: str, body: bytes):
        image = Image.open(io.BytesIO(body)).convert("RGB")
        return self.transform(image), int(path.split("/")[-2].removeprefix("class_"))

    def __getitem__(self, index: int):
        return self._sample(self.paths[index], self._fs().cat(self.paths[index]))

    def __getitems__(self, indices: list[int]):
        if not self.batched:
            return [self[i] for i in indices]
        paths = [self.paths[i] for i in indices]
        bodies = self._fs().cat(paths)
        return [self._sample(path, bodies[path]) for path in paths]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prefix", default="images")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--batched", action="store_true")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    bucket = os.environ.get("S3_BUCKET", "data")
    paths = sorted(p for p in filesystem().find(f"{bucket}/{args.prefix}/") if p.endswith(".jpg"))
    loader = DataLoader(S3fsImages(paths, args.batched), batch_size=args.batch_size, shuffle=True,
                        num_workers=args.workers)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=2), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(4),
                                torch.nn.Flatten(), torch.nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    step = 0
    while step < args.steps:
        for images, labels in loader:
            loss = torch.nn.functional.cross_entropy(model(images), labels % 10)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if step >= args.steps:
                break
    return 0


if __name__ == "__main__":
    sys.exit(main())
