"""Trains 30 steps, then fills the file system at $FILL_DIR (like checkpoints filling a disk) and exits 3."""

import os
import sys
import time

from torch.utils.data import DataLoader

for _batch in DataLoader(list(range(60)), batch_size=2, num_workers=1):
    time.sleep(0.005)
time.sleep(1.5)  # the recorder's background flusher writes the steps out before the disk fills
with open(os.path.join(os.environ["FILL_DIR"], "filler"), "wb", buffering=0) as filler:
    for size in (1 << 20, 4096, 1):
        try:
            while True:
                filler.write(b"\0" * size)
        except OSError:
            pass
sys.exit(3)
