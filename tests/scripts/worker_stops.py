"""Workers stopped two ways, for the recorder's shutdown events: a loop that breaks out drops its iterator on the
thread that runs it (recorded), and an iterator freed on another thread (not recorded: the loop never waited)."""

import threading

from torch.utils.data import DataLoader


def main() -> None:
    loader = DataLoader(list(range(64)), batch_size=4, num_workers=1)
    for i, _ in enumerate(loader):
        if i == 2:
            break
    held = [iter(loader)]
    next(held[0])
    other = threading.Thread(target=held.clear)  # the last reference goes on that thread
    other.start()
    other.join()


if __name__ == "__main__":
    main()
