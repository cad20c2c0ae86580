"""Samples fetched over HTTP from a local server that answers with latency (a remote object store)."""

import http.server
import multiprocessing
import sys
import time
import urllib.request

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

LATENCY_S = 0.03
PAYLOAD = np.random.default_rng(0).integers(0, 255, size=3 * 64 * 64, dtype=np.uint8).tobytes()


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's naming)
        time.sleep(LATENCY_S)
        self.send_response(200)
        self.send_header("Content-Length", str(len(PAYLOAD)))
        self.end_headers()
        self.wfile.write(PAYLOAD)

    def log_message(self, *args):
        pass


class RemoteDataset(Dataset):
    def __init__(self, base_url: str, n: int) -> None:
        self.base_url, self.n = base_url, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int):
        with urllib.request.urlopen(f"{self.base_url}/sample/{index}", timeout=30) as response:
            data = response.read()
        image = torch.frombuffer(bytearray(data), dtype=torch.uint8).reshape(3, 64, 64).float() / 255
        return image, index % 10


def serve(port_queue) -> None:
    """The 'object store': its own process, so it shares nothing with the training process."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    port_queue.put(server.server_address[1])
    server.serve_forever()


def main() -> int:
    torch.set_num_threads(1)  # the training process gets one core, as a GPU job's would
    workers = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    ports = multiprocessing.get_context("spawn").Queue()
    store = multiprocessing.get_context("spawn").Process(target=serve, args=(ports,), daemon=True)
    store.start()
    url = f"http://127.0.0.1:{ports.get(timeout=60)}"
    loader = DataLoader(RemoteDataset(url, 2000), batch_size=8, num_workers=workers)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 64 * 64, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for images, labels in loader:
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    store.terminate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
