#!/usr/bin/env python3
"""CPU per request and requests/s of a running `outbox serve` (issue 44).

Usage: monitor_load.py PID HOST:PORT PATH [REQUESTS] [CONCURRENCY] [REPEATS]

For each repeat: REQUESTS sequential GETs of PATH, the server's utime+stime
(from /proc/PID/stat, every thread) divided by REQUESTS is the CPU per
request; then REQUESTS GETs from CONCURRENCY client threads, their count
over the wall time is requests/s. Prints each repeat and the medians, as
one JSON line at the end. Every answer must be 200 (else it stops).
"""

import json
import os
import socket
import statistics
import sys
import threading
import time

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # fields[0] is field 3 (state): utime is field 14, stime 15.
    return (int(fields[11]) + int(fields[12])) / TICK


def get(addr, path):
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port))) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    status = data.split(b" ", 2)[1]
    if status != b"200":
        raise SystemExit(f"{path}: status {status!r}: {data[:300]!r}")
    return len(data)


def sequential(pid, addr, path, n):
    before = cpu_seconds(pid)
    for _ in range(n):
        get(addr, path)
    return (cpu_seconds(pid) - before) / n * 1000.0


def concurrent(addr, path, n, c):
    left = [n]
    lock = threading.Lock()

    def worker():
        while True:
            with lock:
                if left[0] == 0:
                    return
                left[0] -= 1
            get(addr, path)

    threads = [threading.Thread(target=worker) for _ in range(c)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return n / (time.monotonic() - started)


def main():
    pid, addr, path = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    n = int(sys.argv[4]) if len(sys.argv) > 4 else 200
    c = int(sys.argv[5]) if len(sys.argv) > 5 else 8
    repeats = int(sys.argv[6]) if len(sys.argv) > 6 else 3
    get(addr, path)  # warm
    cpu, rps = [], []
    for r in range(repeats):
        cpu.append(sequential(pid, addr, path, n))
        rps.append(concurrent(addr, path, n, c))
        print(f"  {path} repeat {r + 1}: {cpu[-1]:.2f} ms CPU/request, {rps[-1]:.0f} requests/s", file=sys.stderr)
    print(json.dumps({
        "path": path,
        "cpu_ms": round(statistics.median(cpu), 2),
        "rps": round(statistics.median(rps)),
        "cpu_all": [round(x, 2) for x in cpu],
        "rps_all": [round(x) for x in rps],
    }))


if __name__ == "__main__":
    main()
