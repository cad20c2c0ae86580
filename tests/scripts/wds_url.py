"""WebDataset shards read by URL (``curl`` under WebDataset's own ``gopen``), as jobs at scale read them from an
object store's HTTP endpoint: ``python wds_url.py URL_PATTERN [--workers N]``, e.g.
``http://127.0.0.1:8888/buckets/data/shards/shard-{000000..000003}.tar``."""

import argparse
import io
import sys

import torch
import webdataset as wds
from PIL import Image
from torch.utils.data import DataLoader
from torchvision import transforms


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("urls")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--steps", type=int, default=100000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    crop = transforms.Compose([transforms.RandomResizedCrop(96), transforms.ToTensor()])

    def sample(record):
        image = Image.open(io.BytesIO(record["jpg"])).convert("RGB")
        return crop(image), int(record["cls"])

    dataset = wds.WebDataset(args.urls, shardshuffle=False, empty_check=False).map(sample)
    loader = DataLoader(dataset, batch_size=args.batch_size, num_workers=args.workers)
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
