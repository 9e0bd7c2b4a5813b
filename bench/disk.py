"""The host-local backend on a busy disk: `file://` against flock while another writer syncs the
same filesystem, beside the same pair on the idle disk in alternate rounds."""

import json
import os
import statistics
import subprocess
import threading
import time


def busy_disk(tools, rounds, runs, warmup):
    """`file://` and flock uncontended, as `overhead` measures them, on an idle disk and on a busy
    one, in alternate rounds: busy while a thread of this process writes 1 MiB to a file in the
    same directory and syncs it, again and again. {("file" or "flock", busy): median} and the
    syncs a second it made."""
    contenders = (("file", tools.file), ("flock", tools.flock))
    out = tools.scratch / "busy.json"
    times = {(name, busy): [] for name, _ in contenders for busy in (False, True)}
    syncs, synced = [0], 0.0
    for _ in range(rounds):
        for busy in (False, True):
            stop = threading.Event()

            def sync():
                block = os.urandom(1 << 20)
                with open(tools.scratch / "busy-disk", "wb") as f:
                    while not stop.is_set():
                        f.seek(0)
                        f.write(block)
                        f.flush()
                        os.fsync(f.fileno())
                        syncs[0] += 1

            syncer = threading.Thread(target=sync)
            started = time.monotonic()
            if busy:
                syncer.start()
            try:
                subprocess.run(["hyperfine", "-N", "--style", "none", "--warmup", str(warmup), "--runs", str(runs),
                                "--export-json", str(out),
                                *(" ".join(make("bench-busy", "true")) for _, make in contenders)],
                               check=True, stdout=subprocess.DEVNULL)
            finally:
                stop.set()
                if busy:
                    syncer.join()
                    synced += time.monotonic() - started
            for (name, _), result in zip(contenders, json.loads(out.read_text())["results"]):
                times[(name, busy)].extend(result["times"])
    return {key: statistics.median(t) for key, t in times.items()}, syncs[0] / synced
