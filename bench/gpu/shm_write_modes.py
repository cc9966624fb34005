"""How fast can N threads put one request's rows into ONE tmpfs file?

tmpfs serialises write(2)/pwrite(2) on a file under the inode lock, so threads that pwrite
slices of the same file queue behind each other. This compares, for one file of the size of a
8192-token request at Kimi width (470 MB), written by 1..N threads:

* ``pwrite``: os.pwrite of slices;
* ``mmap``: copy slices into a shared mapping of the file (page faults allocate pages);
* ``huge+...``: the same with madvise(MADV_HUGEPAGE) on the mapping;
* ``falloc+mmap``: fallocate the slice's range (ENOSPC arrives as an error, never as SIGBUS),
  then copy into the mapping.

Run: ``python bench/gpu/shm_write_modes.py [--mb 470] [--threads 1,8,16]``; prints GB/s as JSON.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import torch


def run(mode: str, src: torch.Tensor, path: str, threads: int, slice_bytes: int) -> float:
    n = src.numel()
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    os.ftruncate(fd, n)
    mv = memoryview(src.numpy())
    mm = dst = None
    if mode != "pwrite":
        mm = mmap.mmap(fd, n, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        if mode.startswith("huge") and hasattr(mmap, "MADV_HUGEPAGE"):
            mm.madvise(mmap.MADV_HUGEPAGE)
        dst = torch.frombuffer(mm, dtype=torch.uint8)
    ranges = [(a, min(a + slice_bytes, n)) for a in range(0, n, slice_bytes)]

    def one(r):
        a, b = r
        if mode == "pwrite":
            data, off = mv[a:b], a
            while len(data):
                k = os.pwrite(fd, data, off)
                data, off = data[k:], off + k
        else:
            if mode.endswith("falloc+mmap"):
                os.posix_fallocate(fd, a, b - a)
            dst[a:b].copy_(src[a:b])

    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, ranges))
    dt = time.perf_counter() - t0
    dst = None  # drop the view before closing the mapping
    if mm is not None:
        mm.close()
    os.close(fd)
    os.unlink(path)
    return n / dt / 1e9


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=470)
    ap.add_argument("--threads", default="1,8,16")
    ap.add_argument("--slice-mb", type=int, default=8)
    ap.add_argument("--dir", default="/dev/shm")
    args = ap.parse_args()
    torch.set_num_threads(1)
    pin = torch.cuda.is_available()
    src = torch.randint(0, 255, (args.mb << 20,), dtype=torch.uint8)
    if pin:
        src = src.pin_memory()
    d = tempfile.mkdtemp(dir=args.dir)
    res = {}
    for mode in ("pwrite", "mmap", "falloc+mmap", "huge+mmap", "huge+falloc+mmap"):
        for t in [int(x) for x in args.threads.split(",")]:
            best = max(run(mode, src, f"{d}/f", t, args.slice_mb << 20) for _ in range(3))
            res[f"{mode}_t{t}_GBps"] = round(best, 2)
    os.rmdir(d)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
