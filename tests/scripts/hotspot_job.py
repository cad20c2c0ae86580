"""One planted cost per sample at a known line: hotspot_job.py SCENARIO START_METHOD [WORKERS].

Each scenario's costly line carries a ``# planted: SCENARIO`` comment (tests/e2e/test_hotspots.py finds it there):
almost all of a sample's time is spent on it, so it must come out as the top hotspot of the limiting stage.
With ``--no-frames`` the script first takes SIGALRM for itself (so the signal sampler gives way) and removes
``sys._current_frames`` (so the thread sampler cannot run either); spawned workers re-import this module and do
the same: stack sampling is then impossible in every process. With ``--own-sigalrm`` it only takes SIGALRM: the
thread sampler samples instead.
"""

import json
import random
import re
import signal
import sys
import time

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

if "--no-frames" in sys.argv or "--own-sigalrm" in sys.argv:
    signal.signal(signal.SIGALRM, lambda signum, frame: None)
if "--no-frames" in sys.argv:
    del sys._current_frames

TEXT = " ".join(random.Random(0).choice(("alpha", "beta", "gamma", "delta", "x1", "y22", "z333"))
                for _ in range(3000))
BLOB = json.dumps([{"id": i, "name": f"item{i}", "tags": ["a", "b", "c"], "score": i / 7} for i in range(1500)])
VOCAB = {w: i for i, w in enumerate(("alpha", "beta", "gamma", "delta", "x1", "y22", "z333"))}
ARRAY = np.random.default_rng(0).random(120_000)


def augment(values):
    for _ in range(60_000): values = [values[1], values[0] * 0.999 + 0.5]  # planted: augment
    return values


def tokenize(text):
    return [VOCAB.get(word, 0) + len(word) for word in text.split() for _ in range(10)]  # planted: tokenize


def strip_markup(text):
    return len(re.findall(r"(\w+)\s+(\w+)\s*", text * 3))  # planted: regex


def parse_record(blob):
    return len(json.loads(blob))  # planted: json


def read_slowly():
    time.sleep(0.012)  # planted: io
    return 1.0


def normalize(array):
    return float(np.sort(array)[len(array) // 2])  # planted: numpy


WORK = {
    "augment": lambda i: augment([float(i), 1.0])[0],
    "tokenize": lambda i: float(len(tokenize(TEXT))),
    "regex": lambda i: float(strip_markup(TEXT)),
    "json": lambda i: float(parse_record(BLOB)),
    "io": lambda i: read_slowly(),
    "numpy": lambda i: normalize(ARRAY),
}


class Planted(Dataset):
    def __init__(self, scenario):
        self.scenario = scenario  # by name: spawned workers unpickle the dataset

    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        value = WORK[self.scenario](i)
        return torch.full((16,), value % 1.0), i % 2


def main():
    scenario, start_method = sys.argv[1], sys.argv[2]
    workers = int(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[3].isdigit() else 1
    torch.set_num_threads(1)
    loader = DataLoader(Planted(scenario), batch_size=4, num_workers=workers,
                        multiprocessing_context=start_method if workers else None)
    model = torch.nn.Linear(16, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return 0


if __name__ == "__main__":
    sys.exit(main())
