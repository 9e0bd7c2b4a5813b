#!/usr/bin/env python3
"""locked-run against flock and `etcdctl lock`, on one machine, in one run; its Redis, etcd:// and
postgres:// backends side by side (bench/postgres.py starts the PostgreSQL server, and a PgBouncer
in front of it for one more overhead row).

Measures (docs/how-it-works.md's Performance section explains each): the wrapper's own overhead, the
handoff latency from one holder's end to the next waiter's start, peak RSS, the idle cost of a long hold (CPU time and
Redis commands), and a contention loop. Starts its own redis-server and etcd on loopback and
stops them. `--smoke` runs one short iteration of each, for CI: figures, no verdicts on time.
The scale section (bench/scale.py): W = 1, 8, 32, 96 (and 300 for Redis) waiters queued on one
NAME, time, server commands or statements and context switches per handoff; `--scale` runs it
alone. `--handoffs` (bench/handoffs.py): the handoff to 1, 8 and 32 waiters and the uncontended
run, `file://` and `postgres://` beside flock, this build against `--base BINARY` in the same
rounds. `file://` and flock uncontended on a busy disk (a thread writing and syncing a file on the
same filesystem all along). One 4 MB reply read
by the own client and by the redis crate's parser (examples/resp_parse.rs). Then the redis
crate against the own client (examples/client_cost.rs, built here): one uncontended run on
each, side by side; `--clients` runs that comparison alone.
"""

import argparse
import atexit
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import etcd as etcd_section
from clients import big_reply, build_client_cost, client_cost, client_cost_table
from disk import busy_disk
from handoffs import measure_handoffs
from postgres import Bouncer, Postgres, bin_dir
from scale import postgres_table, readers, scale, scale_table

ROOT = Path(__file__).resolve().parent.parent


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(what, check, timeout=15.0):
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            sys.exit(f"bench: {what} not ready after {timeout}s")
        time.sleep(0.02)


class Servers:
    """A redis-server, an etcd and a PostgreSQL server on free loopback ports, in scratch directories."""

    def __init__(self, scratch):
        self.scratch = scratch
        self.procs = []
        self.redis_port = free_port()
        self.procs.append(subprocess.Popen(
            ["redis-server", "--port", str(self.redis_port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", str(scratch)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait_until("redis-server", lambda: self.redis("PING") == "PONG")
        # Five more, independent, for Redlock.
        self.redlock_ports = [free_port() for _ in range(5)]
        for port in self.redlock_ports:
            self.procs.append(subprocess.Popen(
                ["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                 "--save", "", "--appendonly", "no", "--dir", str(scratch)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for port in self.redlock_ports:
            wait_until("redis-server", lambda: subprocess.run(
                ["redis-cli", "-p", str(port), "PING"], capture_output=True, text=True).stdout.strip() == "PONG")
        client, peer = free_port(), free_port()
        self.etcd = f"http://127.0.0.1:{client}"
        self.procs.append(subprocess.Popen(
            ["etcd", "--data-dir", str(scratch / "etcd"), "--name", "bench",
             "--listen-client-urls", self.etcd, "--advertise-client-urls", self.etcd,
             "--listen-peer-urls", f"http://127.0.0.1:{peer}",
             "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
             "--initial-cluster", f"bench=http://127.0.0.1:{peer}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait_until("etcd", lambda: subprocess.run(
            ["etcdctl", f"--endpoints={self.etcd}", "endpoint", "health"],
            capture_output=True).returncode == 0)
        self.pg = Postgres(free_port())
        self.bouncer = Bouncer(self.pg, free_port())

    def redis(self, *args):
        out = subprocess.run(["redis-cli", "-p", str(self.redis_port), *args],
                             capture_output=True, text=True)
        return out.stdout.strip()

    def stop(self):
        for p in self.procs:
            p.kill()
            p.wait()
        self.bouncer.stop()
        self.pg.stop()


class Tools:
    """How each tool runs a command under a lock named `name`."""

    def __init__(self, binary, servers, scratch):
        self.binary = binary
        self.servers = servers
        self.scratch = scratch

    def locked_run(self, name, *cmd, extra=()):
        url = f"redis://127.0.0.1:{self.servers.redis_port}"
        return [str(self.binary), "-u", url, *extra, name, "--", *cmd]

    def redlock(self, name, *cmd):
        urls = [arg for port in self.servers.redlock_ports for arg in ("-u", f"redis://127.0.0.1:{port}")]
        return [str(self.binary), *urls, name, "--", *cmd]

    def file(self, name, *cmd):
        return [str(self.binary), "-u", f"file://{self.scratch}/locks", name, "--", *cmd]

    def flock(self, name, *cmd):
        return ["flock", str(self.scratch / f"{name}.flock"), *cmd]

    def etcd(self, name, *cmd):
        url = self.servers.etcd.replace("http://", "etcd://")
        return [str(self.binary), "-u", url, name, "--", *cmd]

    def postgres(self, name, *cmd):
        return [str(self.binary), "-u", self.servers.pg.url, name, "--", *cmd]

    def pooled(self, name, *cmd):
        return [str(self.binary), "-u", self.servers.bouncer.url, name, "--", *cmd]

    def etcdctl(self, name, *cmd):
        return ["etcdctl", f"--endpoints={self.servers.etcd}", "lock", name, "--", *cmd]

    def holders(self, name, *cmd):
        return self.locked_run(name, *cmd, extra=("--holders", "3"))

    def shared(self, name, *cmd):
        return self.locked_run(name, *cmd, extra=("--shared",))

    def no_fair(self, name, *cmd):
        return self.locked_run(name, *cmd, extra=("--no-fair",))

    def all(self):
        return [("locked-run", self.locked_run), ("flock", self.flock), ("etcdctl lock", self.etcdctl),
                ("Redlock, 5 servers", self.redlock), ("file", self.file), ("locked-run etcd", self.etcd),
                ("postgres", self.postgres)]

    def overheads(self):
        """What the overhead measures: every tool, a semaphore's run (`--holders 3`) and a
        shared one (`--shared`)."""
        return self.all() + [("--holders 3", self.holders), ("--shared", self.shared),
                             ("postgres via PgBouncer", self.pooled)]


def ms(seconds):
    return f"{seconds * 1000:.2f} ms"


def overhead(tools, rounds, runs, warmup):
    """Median wall time of `X NAME -- true`, by hyperfine. The tools take turns in rounds of
    `runs` each, so a machine that drifts in speed affects all of them alike."""
    out = tools.scratch / "overhead.json"
    commands = [" ".join(make("bench-overhead", "true")) for _, make in tools.overheads()]
    times = {name: [] for name, _ in tools.overheads()}
    for _ in range(rounds):
        subprocess.run(["hyperfine", "-N", "--style", "none", "--warmup", str(warmup), "--runs", str(runs),
                        "--export-json", str(out), *commands], check=True, stdout=subprocess.DEVNULL)
        for (name, _), result in zip(tools.overheads(), json.loads(out.read_text())["results"]):
            times[name].extend(result["times"])
    return {name: statistics.median(t) for name, t in times.items()}


def handoff(tools, runs):
    """Holder's child sleeps 0.4 s then stamps its end; a waiter started 0.2 s after it stamps
    its start first thing; latency = waiter's start - holder's end (CLOCK_REALTIME, ns). The
    tools take turns, run by run."""
    latencies = {name: [] for name, _ in tools.all()}
    for i in range(runs):
        for name, make in tools.all():
            lock = f"bench-handoff-{i}"
            slug = name.replace(" ", "-")
            end_file = tools.scratch / f"end-{slug}-{i}"
            start_file = tools.scratch / f"start-{slug}-{i}"
            holder = subprocess.Popen(make(lock, "sh", "-c", f"sleep 0.4; date +%s%N > {end_file}"))
            time.sleep(0.2)
            with open(start_file, "w") as out:
                waiter = subprocess.Popen(make(lock, "date", "+%s%N"), stdout=out)
            holder.wait(timeout=30)
            waiter.wait(timeout=30)
            latencies[name].append((int(start_file.read_text()) - int(end_file.read_text())) / 1e9)
    results = {}
    for name, values in latencies.items():
        values.sort()
        results[name] = (statistics.median(values), values[int(0.9 * (len(values) - 1))])
    return results


def peak_rss(tools):
    """VmHWM of the wrapper itself while it supervises a sleeping child (kB)."""
    results = {}
    for name, make in (("locked-run", tools.locked_run), ("etcdctl lock", tools.etcdctl)):
        proc = subprocess.Popen(make("bench-rss", "sleep", "1.5"))
        time.sleep(1.0)
        status = Path(f"/proc/{proc.pid}/status").read_text()
        proc.wait(timeout=30)
        results[name] = int(next(l for l in status.splitlines() if l.startswith("VmHWM:")).split()[1])
    return results


def idle_cost(tools, hold, ttl):
    """CPU time of locked-run over a hold (from /proc/PID/schedstat, ns precision) and the
    commands it sent (from MONITOR, which shows what clients send apart from what scripts run)."""
    servers = tools.servers
    monitor = subprocess.Popen(["redis-cli", "-p", str(servers.redis_port), "MONITOR"],
                               stdout=subprocess.PIPE, text=True)
    assert monitor.stdout.readline().strip() == "OK"
    proc = subprocess.Popen(tools.locked_run("bench-idle", "sleep", str(hold), extra=("--ttl", f"{ttl}s")))
    time.sleep(hold - 0.3)
    cpu_ns = int(Path(f"/proc/{proc.pid}/schedstat").read_text().split()[0])
    proc.wait(timeout=hold + 30)
    time.sleep(0.2)
    monitor.terminate()
    lines = monitor.communicate()[0].splitlines()
    sent = {}
    for line in lines:
        if "[" not in line or " lua]" in line:
            continue
        command = line.split("] ", 1)[1].split(" ", 1)[0].strip('"').upper()
        sent[command] = sent.get(command, 0) + 1
    scripts = sent.pop("EVALSHA", 0) + sent.pop("EVAL", 0)
    renewals_expected = int(hold // (ttl / 6))
    return cpu_ns / 1e9, sent, scripts, renewals_expected

def contention(tools, loops, runs, rounds, contenders=None):
    """`loops` parallel loops of `runs` runs of `X NAME -- true` on one NAME: total wall time,
    the median of `rounds` rounds in which the tools take turns."""
    contenders = contenders or (("locked-run", tools.locked_run), ("flock", tools.flock), ("file", tools.file),
                                ("--no-fair", tools.no_fair))
    totals = {name: [] for name, _ in contenders}
    for _ in range(rounds):
        for name, make in contenders:
            cmd = make("bench-contention", "true")

            def loop():
                for _ in range(runs):
                    subprocess.run(cmd, check=True)

            started = time.monotonic()
            threads = [threading.Thread(target=loop) for _ in range(loops)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            totals[name].append(time.monotonic() - started)
    return {name: statistics.median(t) for name, t in totals.items()}


def waits(tools, loops, runs, rounds):
    """Each run's wait for the lock, from its own log (`--log-format json`: the `acquired`
    event's `waited_ms`), under `loops` parallel loops of `runs` runs of `true` on one NAME; fair
    waiting (the default) and `--no-fair`, taking turns over `rounds` rounds."""
    found = {"fair": [], "--no-fair": []}
    for _ in range(rounds):
        for name, extra in (("fair", ()), ("--no-fair", ("--no-fair",))):
            cmd = tools.locked_run("bench-waits", "true", extra=("--log-format", "json", *extra))

            def loop():
                for _ in range(runs):
                    out = subprocess.run(cmd, check=True, stderr=subprocess.PIPE, text=True).stderr
                    for line in out.splitlines():
                        event = json.loads(line)
                        if event.get("event") == "acquired":
                            found[name].append(event["waited_ms"] / 1000)

            threads = [threading.Thread(target=loop) for _ in range(loops)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    results = {}
    for name, values in found.items():
        values.sort()
        results[name] = (statistics.median(values), values[int(0.99 * (len(values) - 1))], values[-1])
    return results


def machine():
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = []
    for tool, args in (("redis-server", ["--version"]), ("etcd", ["--version"]), ("hyperfine", ["--version"])):
        out = subprocess.run([tool, *args], capture_output=True, text=True).stdout.split("\n")[0]
        versions.append(out.strip())
    versions.append(subprocess.run([str(bin_dir() / "postgres"), "--version"], capture_output=True,
                                   text=True).stdout.strip())
    return f"{os.cpu_count()} cores, {cpu}, Linux {platform.release()}; " + "; ".join(versions)


def scale_verdicts(say, results, smoke):
    rows = scale_table(say, results)
    say()
    if smoke:
        say("Targets: (smoke run: no verdict)")
    else:
        redis_verdicts(say, rows)
    say()
    say("postgres:// in the same rounds (fair waiting; statements counted by pg_stat_statements, each of a "
        "transaction's string on its own):")
    say()
    pg = postgres_table(say, results)
    say()
    if smoke or not pg:
        say("Targets: (smoke run: no verdict)")
        return
    # W = 1 is one handoff: the last run's end (its release, its history, its exit) is not shared
    # out over several, as it is from W = 8 on.
    times = [t for w, t, _ in pg if w >= 8]
    wakes = max(n for _, _, n in pg)
    say(f"Targets: postgres:// one wake-up per handoff (at most {wakes:.2f} notifications per handoff at any W): "
        f"{verdict(wakes <= 1.05)}; time per handoff flat in W from W = 8 (max <= 1.5x min: "
        f"{max(times) * 1000:.2f} / {min(times) * 1000:.2f} ms): {verdict(max(times) <= 1.5 * min(times))}.")


def redis_verdicts(say, rows):
    time_ok = all(fa[0] <= 1.3 * fl[0] for _, fa, _, fl, _ in rows)
    w1 = next((fa[0] <= nf[0] for w, fa, nf, _, _ in rows if w == 1), True)
    # The commands the clients send (a script counts once); the server's own count adds every
    # command the scripts run, which no layout of the lock's keys brings near 12 (see docs/how-it-works.md).
    commands_ok = all(fa[2][1] <= 12 for _, fa, _, _, _ in rows)
    etcd_ok = all(fa[0] < et[0] for _, fa, _, _, et in rows if et)
    wakes = [fa[1] for _, fa, _, _, _ in rows]
    flat = max(wakes) <= 1.5 * min(wakes)
    say(f"Targets: fair <= 1.3x flock at every W: {verdict(time_ok)}; fair no slower than `--no-fair` at W = 1: "
        f"{verdict(w1)}; commands sent per fair handoff <= 12 at every W: {verdict(commands_ok)}; ahead of etcdctl "
        f"lock at every W: {verdict(etcd_ok)}; a fair waiter's context switches flat in W (max <= 1.5x min): "
        f"{verdict(flat)}.")


def verdict(ok):
    return "meets" if ok else "MISSES"


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="one short iteration of each (CI)")
    parser.add_argument("--binary", default=str(ROOT / "target/release/locked-run"))
    parser.add_argument("--results", help="also write the table to this markdown file")
    parser.add_argument("--clients", action="store_true",
                        help="only the redis crate against the own client (with --smoke: a short one)")
    parser.add_argument("--handoffs", action="store_true", help="only bench/handoffs.py's measures")
    parser.add_argument("--rounds", type=int, default=3, help="with --handoffs: rounds a W (16 at least at W = 1)")
    parser.add_argument("--scale", action="store_true",
                        help="only the scale section: W waiters on one NAME (with --smoke: W = 1, 8)")
    parser.add_argument("--etcd", action="store_true",
                        help="only the etcd section (bench/etcd.py): etcd:// against etcdctl lock, and what the gRPC "
                             "stack costs a Redis run")
    parser.add_argument("--base", help="with --etcd or --handoffs: another locked-run binary (the landed build), "
                                       "measured beside this one in the same rounds")
    args = parser.parse_args()
    args.shown = f"{args.binary}" + (f"; base: {args.base}" if args.base else "")
    # Each build runs from a copy written the same way (one sequential write): a binary as the
    # linker wrote it started measurably slower on this machine than a copy of itself (0.1 ms
    # of a 2 ms run), which counted against whichever build was not a copy.
    copies = Path(tempfile.mkdtemp(prefix="locked-run-bench-bins-"))
    atexit.register(shutil.rmtree, copies, ignore_errors=True)
    args.binary = str(Path(shutil.copy2(args.binary, copies / "this-build")))
    if args.base:
        args.base = str(Path(shutil.copy2(args.base, copies / "base")))
    binaries = [("this build", Path(args.binary))] + ([("landed", Path(args.base))] if args.base else [])

    for tool in ("redis-server", "redis-cli", "etcd", "etcdctl", "flock", "hyperfine", "psql", "pgbouncer"):
        if not shutil.which(tool):
            sys.exit(f"bench: {tool} is not installed (bench/run installs it)")
    lines = []

    def say(line=""):
        print(line, flush=True)
        lines.append(line)

    if args.etcd:
        say(f"Machine: {machine()}")
        say(f"Date: {time.strftime('%Y-%m-%d %H:%M')}{' (smoke run, not a measurement)' if args.smoke else ''}")
        say()
        etcd_section.run(say, binaries, args.smoke)
        if args.results:
            Path(args.results).write_text("\n".join(lines) + "\n")
        return
    client_binary = None if args.handoffs else build_client_cost()
    scratch = Path(tempfile.mkdtemp(prefix="locked-run-bench-"))
    servers = Servers(scratch)
    tools = Tools(Path(args.binary), servers, scratch)
    # The first run makes postgres://'s tables (no later round pays for it).
    subprocess.run(tools.postgres("bench-init", "true"), check=True)

    smoke = args.smoke
    widths, scale_rounds = ((1, 8), 1) if smoke else ((1, 8, 32, 96, 300), 2)
    try:
        if args.handoffs:
            measure_handoffs(args, Tools(Path(args.base), servers, scratch) if args.base else None, tools, say,
                             lambda: machine())
            if args.results:
                Path(args.results).write_text("\n".join(lines) + "\n")
            return
        if args.scale:
            s = scale(tools, widths, scale_rounds)
            say(f"Machine: {machine()}")
            say(f"Date: {time.strftime('%Y-%m-%d %H:%M')}{' (smoke run, not a measurement)' if smoke else ''}")
            say()
            scale_verdicts(say, s, smoke)
            if args.results:
                Path(args.results).write_text("\n".join(lines) + "\n")
            return
        k = client_cost(tools, client_binary, rounds=1 if smoke else 20, runs=3 if smoke else 15,
                        warmup=1 if smoke else 3, samples=5 if smoke else 400)
        if args.clients:
            say(f"Machine: {machine()}")
            say(f"Date: {time.strftime('%Y-%m-%d %H:%M')}{' (smoke run, not a measurement)' if smoke else ''}")
            say()
            client_cost_table(say, k, smoke)
            if args.results:
                Path(args.results).write_text("\n".join(lines) + "\n")
            return
        o = overhead(tools, rounds=1 if smoke else 10, runs=3 if smoke else 50, warmup=1 if smoke else 5)
        busy, syncs = busy_disk(tools, rounds=1 if smoke else 5, runs=3 if smoke else 30, warmup=1 if smoke else 3)
        h = handoff(tools, runs=1 if smoke else 20)
        r = peak_rss(tools)
        hold, ttl = (3, 3) if smoke else (30, 30)
        cpu, sent, scripts, renewals = idle_cost(tools, hold, ttl)
        c = contention(tools, loops=4, runs=2 if smoke else 50, rounds=1 if smoke else 5)
        w = waits(tools, loops=4, runs=2 if smoke else 50, rounds=1 if smoke else 3)
        s = scale(tools, widths, scale_rounds)
        ch = contention(tools, loops=6, runs=2 if smoke else 20, rounds=1 if smoke else 5,
                        contenders=(("locked-run", tools.locked_run), ("--holders 3", tools.holders)))
        big = big_reply(runs=1 if smoke else 5)
        rd = readers(tools, 32, rounds=1 if smoke else 3)
    finally:
        servers.stop()
        shutil.rmtree(scratch, ignore_errors=True)

    say(f"Machine: {machine()}")
    say(f"Date: {time.strftime('%Y-%m-%d')}{' (smoke run: one iteration each, not a measurement)' if smoke else ''}")
    say()
    say("| measure | locked-run | flock | etcdctl lock | target | verdict |")
    say("|---|---|---|---|---|---|")
    lr, fl, et, rl = o["locked-run"], o["flock"], o["etcdctl lock"], o["Redlock, 5 servers"]
    say(f"| overhead `X NAME -- true`, median | {ms(lr)} ({lr / fl:.2f}x flock) | {ms(fl)} | {ms(et)} ({et / fl:.1f}x flock) "
        f"| <= 1.5x flock | {verdict(lr <= 1.5 * fl)} |")
    say(f"| overhead, Redlock over 5 servers | {ms(rl)} ({rl / fl:.2f}x flock) | - | - | (measured) | - |")
    lf = o["file"]
    say(f"| overhead, host-local `file://` | {ms(lf)} ({lf / fl:.2f}x flock) | - | - | (measured) | - |")
    le = o["locked-run etcd"]
    say(f"| overhead, `etcd://` (one member) | {ms(le)} ({le / fl:.2f}x flock, {le / et:.2f}x etcdctl lock) | - "
        f"| - | < etcdctl lock | {verdict(le < et)} |")
    (bf, bl), (idf, idl) = (busy["file", True], busy["flock", True]), (busy["file", False], busy["flock", False])
    say(f"| overhead, `file://` on a busy disk ({syncs:.0f} syncs/s of 1 MiB beside it) | {ms(bf)} ({bf / bl:.2f}x "
        f"flock on it; idle in the rounds between: {ms(idf)}, {idf / idl:.2f}x flock's {ms(idl)}) | {ms(bl)} | - "
        f"| (measured) | - |")
    pg = o["postgres"]
    say(f"| overhead, `postgres://` (one server, fsync off) | {ms(pg)} ({pg / lr:.2f}x the Redis backend, "
        f"{pg / fl:.2f}x flock) | - | - | <= 1.5x the Redis backend | {verdict(pg <= 1.5 * lr)} |")
    pb = o["postgres via PgBouncer"]
    say(f"| overhead, `postgres://` through PgBouncer (transaction pooling: no fork, warm sessions) | {ms(pb)} "
        f"({pb / lr:.2f}x the Redis backend) | - | - | (measured) | - |")
    lh = o["--holders 3"]
    say(f"| overhead, `--holders 3` | {ms(lh)} ({lh / lr:.2f}x one holder's) | - | - | <= 1.1x one holder's "
        f"| {verdict(lh <= 1.1 * lr)} |")
    ls = o["--shared"]
    say(f"| overhead, `--shared` | {ms(ls)} ({ls / lr:.2f}x an exclusive run's) | - | - "
        f"| <= 1.1x an exclusive run's | {verdict(ls <= 1.1 * lr)} |")
    rs, rx = rd["--shared"], rd["exclusive"]
    say(f"| 32 waiters running `sleep 0.05` let in by one release: `--shared` / exclusive | {rs:.2f} s / {rx:.2f} s "
        f"({rx / rs:.1f}x) | - | - | (measured) | - |")
    (lm, lp), (fm, fp), (em, ep), (rm, rp) = h["locked-run"], h["flock"], h["etcdctl lock"], h["Redlock, 5 servers"]
    say(f"| handoff median / p90 | {ms(lm)} / {ms(lp)} ({lm / fm:.2f}x flock) | {ms(fm)} / {ms(fp)} | {ms(em)} / {ms(ep)} "
        f"| median <= 1.3x flock, < etcdctl | {verdict(lm <= 1.3 * fm and lm < em)} |")
    say(f"| handoff, Redlock over 5 servers | {ms(rm)} / {ms(rp)} ({rm / fm:.2f}x flock) | - | - | (measured) | - |")
    hf, hfp = h["file"]
    say(f"| handoff, host-local `file://` | {ms(hf)} / {ms(hfp)} ({hf / fm:.2f}x flock) | - | - | (measured) | - |")
    he, hep = h["locked-run etcd"]
    say(f"| handoff, `etcd://` | {ms(he)} / {ms(hep)} ({he / fm:.2f}x flock) | - | - | < etcdctl lock "
        f"| {verdict(he < em)} |")
    hp, hpp = h["postgres"]
    say(f"| handoff, `postgres://` | {ms(hp)} / {ms(hpp)} ({hp / fm:.2f}x flock, {hp / lm:.2f}x the Redis backend) "
        f"| - | - | (measured) | - |")
    say(f"| peak RSS of the wrapper | {r['locked-run'] / 1024:.1f} MiB | - | {r['etcdctl lock'] / 1024:.1f} MiB "
        f"| <= 5 MiB | {verdict(r['locked-run'] <= 5 * 1024)} |")
    # Besides the scripts: HELLO when connecting, SUBSCRIBE/UNSUBSCRIBE around the acquire.
    setup = {"HELLO", "SUBSCRIBE", "UNSUBSCRIBE"}
    extra = {k: v for k, v in sent.items() if k not in setup}
    say(f"| {hold} s hold, TTL {ttl} s: CPU time | {cpu * 1000:.1f} ms | - | - | <= 10 ms | {verdict(cpu <= 0.010)} |")
    say(f"| {hold} s hold: commands sent | {scripts} scripts (1 acquire + {renewals} renewals + 1 release expected"
        f", one more renewal if the hold ends just after one is due); also {json.dumps(sent)} | - | - "
        f"| nothing else | {verdict(scripts <= renewals + 3 and not extra)} |")
    lc, fc = c["locked-run"], c["flock"]
    say(f"| contention 4 x {2 if smoke else 50} runs, total | {lc:.2f} s ({lc / fc:.2f}x flock) | {fc:.2f} s | - "
        f"| <= 1.3x flock | {verdict(lc <= 1.3 * fc)} |")
    cf = c["file"]
    say(f"| contention, host-local `file://` | {cf:.2f} s ({cf / fc:.2f}x flock) | - | - | (measured) | - |")
    cn = c["--no-fair"]
    say(f"| contention, `--no-fair` | {cn:.2f} s ({cn / fc:.2f}x flock) | - | - | (measured) | - |")
    (fm_, fp_, fx_), (nm_, np_, nx_) = w["fair"], w["--no-fair"]
    say(f"| each run's wait, 4 x {2 if smoke else 50}, fair: median / p99 / max | {ms(fm_)} / {ms(fp_)} / {ms(fx_)} "
        f"| - | - | max <= 3x median | {verdict(fx_ <= 3 * max(fm_, 0.001))} |")
    say(f"| each run's wait, `--no-fair`: median / p99 / max | {ms(nm_)} / {ms(np_)} / {ms(nx_)} | - | - "
        f"| (measured) | - |")
    h1, h3 = ch["locked-run"], ch["--holders 3"]
    say(f"| contention 6 x {2 if smoke else 20} runs, `--holders 3` | {h3:.2f} s (one holder: {h1:.2f} s) | - | - "
        f"| (measured) | - |")
    say()
    say(f"Scale: W waiters queued behind a holder, time from its release to the last waiter's end, per handoff "
        f"(median of {scale_rounds} rounds, and of 16 handoffs at least for small W):")
    say()
    scale_verdicts(say, s, smoke)
    say()
    say(f"Reading one big reply, over loopback in 4 KiB pieces (median of {1 if smoke else 5}):")
    say()
    for line in big:
        say(f"    {line}")
    say()
    say("The redis crate against the own client:")
    say()
    client_cost_table(say, k, smoke)
    say()
    say("etcd:// against etcdctl lock (bench/etcd.py), and what the gRPC stack costs a Redis run:")
    say()
    etcd_section.run(say, binaries, smoke)
    if args.results:
        Path(args.results).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
