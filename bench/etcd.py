"""The etcd section of the benchmark: this build's `etcd://` against `etcdctl lock` and, with
`--base BINARY`, another build of locked-run (the landed one), on one etcd member, in one run,
the tools taking turns round by round; and what the gRPC stack costs the backends that do not
use it (the binary's size, a Redis run's peak memory, page faults and time, paired with the
other build).

- Uncontended: `X NAME -- true`, hyperfine, interleaved.
- Scale: a holder, W waiters queued behind it (W = 1, 8, 32, 96, 300), each to run `true`; the
  holder lets go and the clock runs until the last waiter ended; per handoff. Twice: as
  bench/run's scale section starts them (the release as soon as every waiter has its key), and
  settled: every one's watch confirmed (etcd's count of Watch streams rose by W) and a
  second more (each locked-run waiter's first heartbeat opened its keep-alive stream; each
  etcdctl, a Go program of some 12 ms of CPU, is done starting). Per handoff too, from the
  member's own metrics: the requests started (`grpc_server_started_total`: a call, or a stream
  once) and the messages received (`grpc_server_msg_received_total`: each keep-alive and watch
  request on a stream counted), by method, and the member's CPU time (/proc, all its threads).
- Peak RSS (GNU time) of an uncontended run on etcd and on Redis.
- Paired on Redis: `X -u redis://... NAME -- true`, this build and the other in each of 3
  hyperfine rounds of 300, each build first in every other round; their CPU and page faults
  (perf stat, 300 runs, twice).

The etcd binary is `LOCKED_RUN_BENCH_ETCD` (a path), else `etcd` on PATH (Debian's 3.4).
"""

import json
import os
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

WIDTHS = (1, 8, 32, 96, 300)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(what, check, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"bench: {what} not ready after {timeout}s")
        time.sleep(0.01)


class Member:
    """One etcd member on free loopback ports, its data in `scratch`."""

    def __init__(self, scratch):
        self.binary = os.environ.get("LOCKED_RUN_BENCH_ETCD") or "etcd"
        client, peer = free_port(), free_port()
        self.url = f"http://127.0.0.1:{client}"
        self.proc = subprocess.Popen(
            [self.binary, "--data-dir", str(scratch / "etcd"), "--name", "bench",
             "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
             "--listen-peer-urls", f"http://127.0.0.1:{peer}",
             "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
             "--initial-cluster", f"bench=http://127.0.0.1:{peer}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until("etcd", lambda: subprocess.run(
            ["etcdctl", f"--endpoints={self.url}", "endpoint", "health"], capture_output=True).returncode == 0)

    def version(self):
        out = subprocess.run([self.binary, "--version"], capture_output=True, text=True).stdout
        return out.splitlines()[0].strip()

    def served(self):
        """{("started"|"received", method): count} from the member's metrics."""
        text = urllib.request.urlopen(self.url + "/metrics", timeout=10).read().decode()
        counts = {}
        for line in text.splitlines():
            for kind, prefix in (("started", "grpc_server_started_total{"),
                                 ("received", "grpc_server_msg_received_total{")):
                if line.startswith(prefix):
                    method = line.split('grpc_method="', 1)[1].split('"', 1)[0]
                    counts[kind, method] = counts.get((kind, method), 0) + float(line.rsplit(" ", 1)[1])
        return counts

    def cpu(self):
        """The member's CPU time so far, all its threads, in seconds."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def keys(self, prefix):
        out = subprocess.run(["etcdctl", f"--endpoints={self.url}", "get", "--prefix", "--keys-only", prefix],
                             capture_output=True, text=True).stdout
        return len([l for l in out.splitlines() if l.strip()])

    def stop(self):
        self.proc.kill()
        self.proc.wait()


def contenders(member, binaries):
    """(label, make) for each tool: make(name, *cmd) is its command line."""
    url = member.url.replace("http://", "etcd://")
    out = [(label, (lambda b: lambda name, *cmd: [str(b), "-u", url, name, "--", *cmd])(binary))
           for label, binary in binaries]
    out.append(("etcdctl lock", lambda name, *cmd: ["etcdctl", f"--endpoints={member.url}", "lock", name, "--", *cmd]))
    return out


def uncontended(tools, scratch, rounds, runs, warmup):
    out = scratch / "etcd-overhead.json"
    commands = [" ".join(make("bench-etcd-overhead", "true")) for _, make in tools]
    times = {label: [] for label, _ in tools}
    for _ in range(rounds):
        subprocess.run(["hyperfine", "-N", "--style", "none", "--warmup", str(warmup), "--runs", str(runs),
                        "--export-json", str(out), *commands], check=True, stdout=subprocess.DEVNULL)
        for (label, _), result in zip(tools, json.loads(out.read_text())["results"]):
            times[label].extend(result["times"])
    return {label: statistics.median(t) for label, t in times.items()}


def one_round(member, scratch, make, width, serial, settle=True):
    """One round: (seconds per handoff, member's CPU per handoff, {(kind, method): per handoff},
    the waiters' mean voluntary context switches). Without `settle`, the holder lets go as
    soon as every waiter has its key, as bench/run's scale section starts them."""
    name = f"bench-etcd-{serial}"
    fifo = scratch / f"{name}.fifo"
    os.mkfifo(fifo)
    holder = subprocess.Popen(make(name, "sh", "-c", f"read x < {fifo}"))
    wait_until(f"the holder of {name}", lambda: member.keys(f"{name}/") >= 1)
    watches = member.served().get(("started", "Watch"), 0)
    waiters = [os.posix_spawnp(cmd[0], cmd, os.environ) for cmd in [make(name, "true")] * width]
    wait_until(f"{width} waiters on {name}", lambda: member.keys(f"{name}/") >= width + 1, timeout=120)
    # Settled: every waiter's watch confirmed, then a heartbeat's time more.
    if settle:
        wait_until(f"{width} watches on {name}",
                   lambda: member.served().get(("started", "Watch"), 0) >= watches + width, timeout=120)
        time.sleep(1.0)
    before, cpu = member.served(), member.cpu()
    started = time.perf_counter()
    with open(fifo, "w") as f:
        f.write("go\n")
    switches = []
    for pid in waiters:
        _, status, usage = os.wait4(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"bench: a waiter on {name} failed")
        switches.append(usage.ru_nvcsw)
    total = time.perf_counter() - started
    holder.wait(timeout=60)
    after, cpu = member.served(), member.cpu() - cpu
    fifo.unlink()
    served = {k: (v - before.get(k, 0)) / width for k, v in after.items() if v - before.get(k, 0) > 0}
    return total / width, cpu / width, served, statistics.mean(switches)


def scale(member, scratch, tools, widths, rounds, settle=True):
    """{W: {label: (ms per handoff, CPU ms, {(kind, method): per handoff}, switches)}}, medians
    over the rounds (at least 16 handoffs a tool at small W), the tools taking turns."""
    results = {}
    serial = 1000 * (not settle)
    for width in widths:
        samples = {label: [] for label, _ in tools}
        for _ in range(max(rounds, -(-16 // width)) if rounds > 1 else rounds):
            for label, make in tools:
                serial += 1
                samples[label].append(one_round(member, scratch, make, width, serial, settle))
        results[width] = {}
        for label, found in samples.items():
            keys = {k for s in found for k in s[2]}
            served = {k: statistics.median(s[2].get(k, 0) for s in found) for k in keys}
            results[width][label] = (statistics.median(s[0] for s in found) * 1000,
                                     statistics.median(s[1] for s in found) * 1000, served,
                                     statistics.median(s[3] for s in found))
    return results


def peak_kib(cmd):
    report = tempfile.NamedTemporaryFile()
    subprocess.run(["/usr/bin/time", "-f", "%M", "-o", report.name, *cmd], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return int(Path(report.name).read_text().split()[-1])


def redis_server(scratch):
    port = free_port()
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(scratch)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_until("redis-server", lambda: subprocess.run(["redis-cli", "-p", str(port), "PING"],
                                                      capture_output=True, text=True).stdout.strip() == "PONG")
    return proc, f"redis://127.0.0.1:{port}"


def paired_redis(binaries, url, scratch, rounds, runs):
    """Wall medians per round, and (task-clock ms, page faults) per run from perf stat, each
    build's `X NAME -- true` on Redis."""
    out = scratch / "paired.json"
    walls = {label: [] for label, _ in binaries}
    for i in range(rounds):
        # Each build first in every other round: hyperfine runs one command's runs, then the
        # other's, and the first of a round was the slower on a machine still settling.
        order = binaries if i % 2 == 0 else list(reversed(binaries))
        commands = [f"{b} -u {url} bench-paired -- true" for _, b in order]
        subprocess.run(["hyperfine", "-N", "--style", "none", "--warmup", "20", "--runs", str(runs),
                        "--export-json", str(out), *commands], check=True, stdout=subprocess.DEVNULL)
        for (label, _), result in zip(order, json.loads(out.read_text())["results"]):
            walls[label].append(result["median"])
    counted = {}
    if shutil.which("perf"):
        for label, binary in binaries:
            counted[label] = []
            for _ in range(2):
                stat = subprocess.run(["perf", "stat", "-x", ",", "-e", "task-clock,page-faults", "-r", str(runs),
                                       str(binary), "-u", url, "bench-paired", "--", "true"],
                                      capture_output=True, text=True).stderr
                values = {}
                for line in stat.splitlines():
                    parts = line.split(",")
                    if len(parts) > 2 and parts[2] in ("task-clock", "page-faults"):
                        values[parts[2]] = float(parts[0])
                counted[label].append((values.get("task-clock", 0), values.get("page-faults", 0)))
    return walls, counted


def run(say, binaries, smoke):
    """The whole section, printed through `say`; `binaries`: [(label, path)], this build first."""
    scratch = Path(tempfile.mkdtemp(prefix="locked-run-bench-etcd-"))
    member = Member(scratch)
    redis, redis_url = redis_server(scratch)
    try:
        tools = contenders(member, binaries)
        o = uncontended(tools, scratch, rounds=1 if smoke else 10, runs=3 if smoke else 30, warmup=1 if smoke else 5)
        widths = (1, 8) if smoke else WIDTHS
        s = scale(member, scratch, tools, widths, 1 if smoke else 2)
        u = scale(member, scratch, tools, widths, 1 if smoke else 2, settle=False)
        rss = {label: (peak_kib(make("bench-etcd-rss", "true")),
                       peak_kib([str(b), "-u", redis_url, "bench-rss", "--", "true"]))
               for (label, make), (_, b) in zip(tools, binaries)}
        walls, counted = paired_redis(binaries, redis_url, scratch, rounds=1 if smoke else 3,
                                      runs=10 if smoke else 300)
        version = member.version()
    finally:
        member.stop()
        redis.kill()
        redis.wait()
        shutil.rmtree(scratch, ignore_errors=True)
    table(say, binaries, o, s, u, rss, walls, counted, version, smoke)


def verdict(ok):
    return "meets" if ok else "MISSES"


def calls(served, kind):
    """Requests (or messages) per handoff, and their split by method."""
    by = sorted(((m, n) for (k, m), n in served.items() if k == kind and n >= 0.05), key=lambda x: -x[1])
    return sum(n for _, n in by), ", ".join(f"{m} {n:.2f}" for m, n in by)


def table(say, binaries, o, s, u, rss, walls, counted, version, smoke):
    this, = [label for label, _ in binaries[:1]]
    others = [label for label, _ in binaries[1:]]
    say(f"etcd: {version}, one member on loopback.")
    say()
    say("| measure | " + " | ".join([this, *others, "etcdctl lock"]) + " | target | verdict |")
    say("|---|" + "---|" * (len(binaries) + 1) + "---|---|")
    et = o["etcdctl lock"]
    cells = [f"{o[l] * 1000:.2f} ms ({o[l] / et:.2f}x)" for l, _ in binaries] + [f"{et * 1000:.2f} ms"]
    say(f"| uncontended `X NAME -- true` | {' | '.join(cells)} | <= 0.3x etcdctl lock | {verdict(o[this] <= 0.3 * et)} |")
    cells = [f"{rss[l][0] / 1024:.1f} MiB" for l, _ in binaries] + ["-"]
    say(f"| peak RSS, a run on etcd | {' | '.join(cells)} | <= 6 MiB | {verdict(rss[this][0] <= 6 * 1024)} |")
    cells = [f"{rss[l][1] / 1024:.1f} MiB" for l, _ in binaries] + ["-"]
    say(f"| peak RSS, a run on Redis | {' | '.join(cells)} | <= 5 MiB | {verdict(rss[this][1] <= 5 * 1024)} |")
    cells = [f"{os.path.getsize(b) / 1e6:.2f} MB" for _, b in binaries] + ["-"]
    say(f"| binary size | {' | '.join(cells)} | (measured) | - |")
    cells = [" / ".join(f"{w * 1000:.2f}" for w in walls[l]) + " ms" for l, _ in binaries] + ["-"]
    ok = statistics.median(walls[this]) <= min(statistics.median(walls[l]) for l in [this, *others]) * 1.01
    say(f"| a Redis run, paired (wall medians of each round) | {' | '.join(cells)} | no slower than {others[0] if others else '-'} "
        f"| {verdict(ok) if others else '-'} |")
    if counted:
        cells = [" / ".join(f"{c:.2f} ms, {f:.0f} faults" for c, f in counted[l]) for l, _ in binaries] + ["-"]
        say(f"| a Redis run: CPU, page faults (perf stat, twice) | {' | '.join(cells)} | (measured) | - |")
    say()
    say("Per handoff, W waiters queued (settled) behind a holder, on one member: ms, the member's CPU ms, "
        "requests started (calls and streams), messages received:")
    say()
    labels = [this, *others, "etcdctl lock"]
    say("| W | " + " | ".join(f"{l} ms" for l in labels) + " | " + " | ".join(f"{l} etcd CPU" for l in labels)
        + " | " + " | ".join(f"{l} requests" for l in labels) + " | " + " | ".join(f"{l} messages" for l in labels) + " |")
    say("|---|" + "---|" * (4 * len(labels)))
    verdicts = []
    for width, r in s.items():
        row = [f"{r[l][0]:.2f}" for l in labels] + [f"{r[l][1]:.2f}" for l in labels]
        row += [f"{calls(r[l][2], 'started')[0]:.2f} ({calls(r[l][2], 'started')[1]})" for l in labels]
        row += [f"{calls(r[l][2], 'received')[0]:.2f}" for l in labels]
        say(f"| {width} | " + " | ".join(row) + " |")
        verdicts.append((width, r[this][0] < r["etcdctl lock"][0],
                         calls(r[this][2], "started")[0] <= calls(r["etcdctl lock"][2], "started")[0]))
    say()
    say("The same, the holder letting go as soon as every waiter has its key (as bench/run's scale section "
        "starts them: an etcdctl waiter, a Go program, may still be starting), ms per handoff:")
    say()
    say("| W | " + " | ".join(labels) + " |")
    say("|---|" + "---|" * len(labels))
    for width, r in u.items():
        say(f"| {width} | " + " | ".join(f"{r[l][0]:.2f}" for l in labels) + " |")
        verdicts.append((width, r[this][0] < r["etcdctl lock"][0], True))
    say()
    if smoke:
        say("Targets: (smoke run: no verdict)")
        return
    ahead = all(a for _, a, _ in verdicts)
    fewer = all(f for _, _, f in verdicts)
    say(f"Targets: ahead of etcdctl lock per handoff at every W: {verdict(ahead)} "
        f"({', '.join(f'W={w}' for w, a, _ in verdicts if not a) or 'all'}{' behind' if not ahead else ''}); "
        f"requests started per handoff no more than etcdctl lock's: {verdict(fewer)}.")
