"""A Lightning job as users write it: the DataLoader built in the module's ``train_dataloader`` hook with
0 workers, each sample read from slow storage (a 1 ms wait) and transformed in Python. Needs lightning;
used by tests that skip without it."""

import argparse
import random
import time

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset


class SlowSamples(Dataset):
    def __len__(self) -> int:
        return 4000

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(0.001)  # the read: network storage answers in about a millisecond
        rng = random.Random(index)
        values = [rng.random() for _ in range(64)]
        for _ in range(10):  # the transform: pure Python, per sample
            values = sorted(v * 0.999 + rng.random() * 0.001 for v in values)
        return torch.tensor(values), torch.tensor(index % 2)


class Classifier(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(64, 2)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self):
        return DataLoader(SlowSamples(), batch_size=16, shuffle=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    trainer = L.Trainer(max_steps=args.steps, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Classifier())


if __name__ == "__main__":
    main()
