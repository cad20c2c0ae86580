"""A client's CPU per request and per body byte: GETs of several body sizes from a loopback HTTP server (in its own
process), each body written to a file as a download library writes a shard, and a line fitted through the client
thread's CPU per request against the body's size. The slope is ``recommend.CPU_S_PER_BODY_BYTE`` (calibration:
req-cpu-per-byte): the part of a download's CPU that larger shards do not divide.

Run:  python benchmarks/request_cpu.py [--sizes 16384 262144 4194304] [--seconds 2]
"""

from __future__ import annotations

import argparse
import http.client
import statistics
import subprocess
import sys
import tempfile
import time

SERVER = """
import http.server, os, sys
sizes = {}
class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        size = int(self.path.strip("/"))
        body = sizes.get(size) or sizes.setdefault(size, os.urandom(size))
        self.send_response(200)
        self.send_header("Content-Length", str(size))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


def cpu_per_request(port: int, size: int, seconds: float) -> float:
    """The client thread's CPU seconds per GET of ``size`` bytes, the body written to a file."""
    conn = http.client.HTTPConnection("127.0.0.1", port)
    conn.request("GET", f"/{size}")  # the connection opened and the body made before the clock starts
    conn.getresponse().read()
    done, began, cpu0 = 0, time.perf_counter(), time.thread_time()
    with tempfile.TemporaryFile() as sink:
        while time.perf_counter() - began < seconds or done < 5:
            conn.request("GET", f"/{size}")
            answer = conn.getresponse()
            sink.seek(0)
            while chunk := answer.read(1 << 16):
                sink.write(chunk)
            done += 1
    conn.close()
    return (time.thread_time() - cpu0) / done


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[16_384, 262_144, 4_194_304])
    p.add_argument("--seconds", type=float, default=2.0, help="per size and round")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        measured = {size: [] for size in args.sizes}
        for _round in range(args.rounds):
            for size in args.sizes:
                measured[size].append(cpu_per_request(port, size, args.seconds))
    finally:
        server.kill()
        server.wait()
    points = [(size, statistics.median(values)) for size, values in measured.items()]
    for size, cpu in points:
        print(f"{size:>10} bytes: {1e3 * cpu:.3f} ms of client CPU a request (median of {args.rounds})")
    mean_x = statistics.fmean(x for x, _ in points)
    mean_y = statistics.fmean(y for _, y in points)
    slope = (sum((x - mean_x) * (y - mean_y) for x, y in points) / sum((x - mean_x) ** 2 for x, _ in points))
    print(f"fit: {1e3 * (mean_y - slope * mean_x):.3f} ms a request + {1e9 * slope:.3f} ns a body byte "
          f"({1e3 * slope * 1e6:.2f} ms a MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
