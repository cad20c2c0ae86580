"""A small GPU training job: uint8 images made per index, pinned non-blocking copies, a conv net.

``--sleep-ms`` per sample makes the input side slow (input-bound); ``--width`` makes the model heavy
(compute-bound). Runs on the CPU when no GPU is present, so it can be tried anywhere.
"""

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Images(Dataset):
    def __init__(self, n, size, sleep_ms):
        self.n, self.size, self.sleep = n, size, sleep_ms / 1000.0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.sleep:
            time.sleep(self.sleep)
        g = torch.Generator().manual_seed(i)
        return torch.randint(0, 256, (3, self.size, self.size), dtype=torch.uint8, generator=g), i % 10


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--sleep-ms", type=float, default=0.0)
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--batches", type=int, default=60)
    args = p.parse_args()
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    loader = DataLoader(Images(args.batches * args.batch_size, args.size, args.sleep_ms), batch_size=args.batch_size,
                        num_workers=args.workers, pin_memory=device.type == "cuda", shuffle=False)
    w = args.width
    model = nn.Sequential(nn.Conv2d(3, w, 3, padding=1), nn.ReLU(), nn.Conv2d(w, w, 3, padding=1), nn.ReLU(),
                          nn.Conv2d(w, w, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(w, 10)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mean = torch.tensor([0.485, 0.456, 0.406], device=device).view(1, 3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225], device=device).view(1, 3, 1, 1)
    loss = None
    for images, labels in loader:
        images = images.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        x = (images.float() / 255 - mean) / std
        loss = nn.functional.cross_entropy(model(x), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    print(f"final loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
