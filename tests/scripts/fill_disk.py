"""Fills the file system at $FILL_DIR (like checkpoints filling a disk) around a short training loop.

Default: trains 30 steps with one worker, waits for the recorder's background flusher to write the steps out,
fills the disk and exits 3. ``--first``: fills before training (the recorder then finds the disk full).
``--leave-room BYTES``: gives back that much after filling (room for a session, none for the history's files).
"""

import argparse
import os
import sys
import time

from torch.utils.data import DataLoader


def fill(folder: str) -> str:
    """Write into ``folder`` until the disk refuses even one byte; the filler file's path."""
    path = os.path.join(folder, "filler")
    with open(path, "wb", buffering=0) as filler:
        for size in (1 << 20, 4096, 1):
            try:
                while True:
                    filler.write(b"\0" * size)
            except OSError:
                pass
    return path


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--first", action="store_true", help="fill before training")
    p.add_argument("--leave-room", type=int, default=0, help="bytes to give back after filling")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--exit-code", type=int, default=3)
    args = p.parse_args()
    folder = os.environ["FILL_DIR"]
    if args.first:
        fill(folder)
    for _batch in DataLoader(list(range(60)), batch_size=2, num_workers=args.workers):
        time.sleep(0.005)
    if not args.first:
        time.sleep(1.5)  # the recorder's background flusher writes the steps out before the disk fills
        path = fill(folder)
        if args.leave_room:
            os.truncate(path, max(0, os.path.getsize(path) - args.leave_room))
    return args.exit_code


if __name__ == "__main__":
    sys.exit(main())
