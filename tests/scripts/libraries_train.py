"""A loader built on torchvision.io + transforms v2 (or OpenCV): its calls must be timed by name."""

import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset


class TorchvisionV2(Dataset):
    def __init__(self, files):
        from torchvision.transforms import v2

        self.files = files
        self.transform = v2.Compose([v2.RandomResizedCrop(64, antialias=True), v2.RandomHorizontalFlip(),
                                     v2.ToDtype(torch.float32, scale=True), v2.Normalize([0.5] * 3, [0.25] * 3)])

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        import torchvision.io

        data = torchvision.io.read_file(str(self.files[i]))
        return self.transform(torchvision.io.decode_jpeg(data)), 0


class OpenCV(Dataset):
    def __init__(self, files):
        self.files = files

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        import cv2

        image = cv2.cvtColor(cv2.imread(str(self.files[i])), cv2.COLOR_BGR2RGB)
        return torch.from_numpy(cv2.resize(image, (64, 64))).permute(2, 0, 1).float(), 0


def main():
    root, kind, workers = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    files = sorted(root.rglob("*.jpg"))[:64]
    collate = None
    if kind == "turbojpeg":  # stallscope's own fast path, its libjpeg-turbo backend
        from stallscope.data import FastImageFolder, RandomResizedCrop, collate_uint8

        dataset, collate = FastImageFolder(root, RandomResizedCrop(64), decoder="turbojpeg"), collate_uint8
    else:
        dataset = TorchvisionV2(files) if kind == "v2" else OpenCV(files)
    for images, _ in DataLoader(dataset, batch_size=8, num_workers=workers, collate_fn=collate):
        images.float().mean()


if __name__ == "__main__":
    main()
