"""Text batches packed into one flat tensor: packed_tokens.py WORKERS [iterable | drop].

Each sample is a token sequence of 20 to 59 ids; the collate puts a batch's sequences end to end (and their
offsets beside them), as EmbeddingBag and varlen attention want. The batch's first length is then its tokens:
the samples are what the sampler gave (16 per batch; 150 samples, so the last batch holds 6). With ``drop``, every
tenth sample is unreadable (None) and a plain collate leaves it out: 135 samples, fewer than the sampler gave.
"""

import sys

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

SAMPLES = 150


def sequence(i):
    return torch.arange(20 + i % 40) % 1000, i % 2


class Texts(Dataset):
    def __len__(self):
        return SAMPLES

    def __getitem__(self, i):
        return sequence(i)


class StreamedTexts(IterableDataset):
    def __iter__(self):
        info = get_worker_info()
        share = range(SAMPLES) if info is None else range(info.id, SAMPLES, info.num_workers)
        return (sequence(i) for i in share)


def pack(batch):
    tokens = torch.cat([s[0] for s in batch])
    offsets = torch.tensor([0] + [len(s[0]) for s in batch[:-1]]).cumsum(0)
    return tokens, offsets, torch.tensor([s[1] for s in batch])


class SomeUnreadable(Dataset):
    def __len__(self):
        return SAMPLES

    def __getitem__(self, i):
        return None if i % 10 == 0 else (torch.zeros(4, dtype=torch.long) + i % 1000, i % 2)


def without_unreadable(batch):
    tokens, labels = zip(*[s for s in batch if s is not None])
    return torch.stack(tokens), torch.arange(len(tokens)), torch.tensor(labels)


if __name__ == "__main__":
    workers = int(sys.argv[1])
    dropping = "drop" in sys.argv
    dataset = StreamedTexts() if "iterable" in sys.argv else SomeUnreadable() if dropping else Texts()
    loader = DataLoader(dataset, batch_size=16, num_workers=workers,
                        collate_fn=without_unreadable if dropping else pack)
    embed, head = torch.nn.EmbeddingBag(1000, 8, mode="mean"), torch.nn.Linear(8, 2)
    opt = torch.optim.SGD([*embed.parameters(), *head.parameters()], lr=0.1)
    seen = 0
    for tokens, offsets, labels in loader:
        if dropping:  # one sequence per row: EmbeddingBag takes a 2-D batch without offsets
            tokens, offsets = tokens.flatten(), offsets * tokens.shape[1]
        loss = torch.nn.functional.cross_entropy(head(embed(tokens, offsets)), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        seen += len(labels)
    print("samples", seen)
