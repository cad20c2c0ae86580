"""An ImageNet-style job whose JPEGs live in an S3 bucket: ``__getitem__`` GETs each one with boto3 (the endpoint and
keys from the usual AWS environment variables), decodes it with Pillow and crops it with torchvision.

``--threads N`` fetches a batch's objects on N threads (the dataset's ``__getitems__``, which the DataLoader calls
with a whole batch's indices): the change stallscope advises for a latency-bound store.
"""

import argparse
import io
import os
import sys
from concurrent.futures import ThreadPoolExecutor

import boto3
import botocore.config
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from torchvision import transforms


class S3Images(Dataset):
    def __init__(self, bucket: str, keys: list[str], threads: int) -> None:
        self.bucket, self.keys, self.threads = bucket, keys, threads
        self.client = None
        self.pool = None
        self.transform = transforms.Compose([transforms.RandomResizedCrop(96), transforms.ToTensor()])

    def __len__(self) -> int:
        return len(self.keys)

    def _client(self):
        if self.client is None:  # one per process: a boto3 client is not to be shared across a fork
            config = botocore.config.Config(max_pool_connections=max(10, self.threads))
            self.client = boto3.client("s3", config=config)
        return self.client

    def __getitem__(self, index: int):
        body = self._client().get_object(Bucket=self.bucket, Key=self.keys[index])["Body"].read()
        image = Image.open(io.BytesIO(body)).convert("RGB")
        return self.transform(image), int(self.keys[index].split("/")[-2].removeprefix("class_"))

    def __getitems__(self, indices: list[int]):
        if self.threads <= 1:
            return [self[i] for i in indices]
        if self.pool is None:
            self.pool = ThreadPoolExecutor(self.threads)
        self._client()
        return list(self.pool.map(self.__getitem__, indices))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prefix", default="images")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--print-steps", action="store_true", help="print 'step N' after each step, flushed")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    bucket = os.environ.get("S3_BUCKET", "data")
    listing = boto3.client("s3").get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=args.prefix + "/")
    keys = sorted(o["Key"] for page in listing for o in page.get("Contents", []) if o["Key"].endswith(".jpg"))
    loader = DataLoader(S3Images(bucket, keys, args.threads), batch_size=args.batch_size, shuffle=True,
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
            if args.print_steps:
                print(f"step {step}", flush=True)
            if step >= args.steps:
                break
    return 0


if __name__ == "__main__":
    sys.exit(main())
