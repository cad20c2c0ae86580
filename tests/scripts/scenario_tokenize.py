"""Text classification where each sample is tokenized in pure Python inside the dataset."""

import random
import re
import sys

import torch
from torch.utils.data import DataLoader, Dataset

WORDS = ("the quick brown fox jumps over lazy dog data loader worker pipeline tensor gradient model "
         "batch epoch token vocabulary sentence language training inference memory cache storage").split()


class TextDataset(Dataset):
    def __init__(self, n: int, length: int) -> None:
        rng = random.Random(0)
        self.texts = [" ".join(rng.choice(WORDS) for _ in range(length)) for _ in range(n)]
        self.vocab = {}

    def __len__(self) -> int:
        return len(self.texts)

    def tokenize(self, text: str) -> list[int]:
        # A deliberately naive byte-pair style tokenizer: character pieces merged greedily, in Python.
        ids = []
        for word in re.findall(r"\w+|[^\w\s]", text.lower()):
            pieces = list(word)
            merged = True
            while merged and len(pieces) > 1:
                merged = False
                for i in range(len(pieces) - 1):
                    pair = pieces[i] + pieces[i + 1]
                    if len(pair) <= 4:
                        pieces[i:i + 2] = [pair]
                        merged = True
                        break
            ids.extend(hash(p) % 30000 for p in pieces)
        return ids

    def __getitem__(self, index: int):
        ids = self.tokenize(self.texts[index])[:256]
        ids += [0] * (256 - len(ids))
        return torch.tensor(ids), index % 2


def main() -> int:
    torch.set_num_threads(1)  # the training process gets one core, as a GPU job's would
    workers = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    loader = DataLoader(TextDataset(2000, 1000), batch_size=16, shuffle=True, num_workers=workers)
    model = torch.nn.Sequential(torch.nn.EmbeddingBag(30000, 16, mode="mean"), torch.nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for ids, labels in loader:
        loss = torch.nn.functional.cross_entropy(model(ids), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return 0


if __name__ == "__main__":
    sys.exit(main())
