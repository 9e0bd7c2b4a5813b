"""The scale section of the benchmark: hundreds of waiters on one NAME.

A holder takes NAME; W waiters queue behind it, each to run `true` once it has the lock; the
holder lets go (its command reads a line from a FIFO, which the benchmark writes), and the clock
runs until the last waiter has ended. Per handoff: the total over W, the server commands (Redis's
`INFO stats` and `INFO commandstats`: every command, those the scripts run included, and the
ones the clients sent), and the waiters' voluntary context switches (wait4), which count how
often each waiter process was woken: flat in W when a release wakes one waiter, growing with W
when every release reaches every waiter.
"""

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

# Commands a script cannot run: what the clients themselves sent.
CLIENT_ONLY = {"hello", "auth", "select", "ping", "subscribe", "ssubscribe", "unsubscribe", "sunsubscribe",
               "eval", "evalsha", "eval_ro", "evalsha_ro", "client|setname", "client|setinfo"}


def redis_counts(tools):
    """(every command, the clients' own) processed so far by the benchmark's redis-server."""
    stats = subprocess.run(["redis-cli", "-p", str(tools.servers.redis_port), "INFO", "commandstats"],
                           capture_output=True, text=True, check=True).stdout
    total = client = 0
    for line in stats.splitlines():
        if not line.startswith("cmdstat_"):
            continue
        name, fields = line[len("cmdstat_"):].split(":", 1)
        calls = int(fields.split("calls=", 1)[1].split(",", 1)[0])
        total += calls
        if name in CLIENT_ONLY:
            client += calls
    return total, client


def queued(tools, name, how, count):
    """Whether `count` waiters wait for `name`, by the evidence each tool leaves."""
    if how == "redis":
        out = subprocess.run(["redis-cli", "-p", str(tools.servers.redis_port), "ZCARD", f"queue:{{{name}}}"],
                             capture_output=True, text=True).stdout.strip()
        return out.isdigit() and int(out) >= count
    if how == "etcd":
        out = subprocess.run(["etcdctl", f"--endpoints={tools.servers.etcd}", "get", "--prefix", "--keys-only",
                              f"{name}/"], capture_output=True, text=True).stdout
        return len([l for l in out.splitlines() if l.strip()]) >= count + 1
    if how == "flock":
        # Blocked flock requests are the `->` lines of /proc/locks.
        return sum(1 for l in Path("/proc/locks").read_text().splitlines() if "->" in l) >= count
    raise ValueError(how)


def one_round(tools, label, make, how, width, serial, hold=None, work=("true",)):
    """One round: `hold` (default `make`) holds, W waiters made by `make` queue and run `work`."""
    name = f"bench-scale-{label.replace(' ', '-')}-{width}-{serial}"
    fifo = tools.scratch / f"{name}.fifo"
    os.mkfifo(fifo)
    holder = subprocess.Popen((hold or make)(name, "sh", "-c", f"read x < {fifo}"))
    # The holder holds once a waiter would find it busy: for Redis, the lock key exists.
    deadline = time.monotonic() + 30
    while not holds(tools, name, how):
        if time.monotonic() > deadline or holder.poll() is not None:
            sys.exit(f"bench: {label} holder did not take {name}")
        time.sleep(0.005)
    before = redis_counts(tools)
    waiters = [os.posix_spawnp(cmd[0], cmd, os.environ) for cmd in [make(name, *work)] * width]
    deadline = time.monotonic() + 60
    while not queued(tools, name, how, width):
        if time.monotonic() > deadline:
            sys.exit(f"bench: {width} {label} waiters did not queue on {name}")
        time.sleep(0.01)
    started = time.perf_counter()
    with open(fifo, "w") as f:
        f.write("go\n")
    switches = []
    for pid in waiters:
        _, status, usage = os.wait4(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            sys.exit(f"bench: a {label} waiter failed")
        switches.append(usage.ru_nvcsw)
    total = time.perf_counter() - started
    holder.wait(timeout=30)
    after = redis_counts(tools)
    fifo.unlink()
    commands = [(a - b) / width for a, b in zip(after, before)] if how == "redis" else None
    return total / width, statistics.mean(switches), commands


def holds(tools, name, how):
    if how == "redis":
        out = subprocess.run(["redis-cli", "-p", str(tools.servers.redis_port), "EXISTS", f"lock:{{{name}}}"],
                             capture_output=True, text=True).stdout.strip()
        return out == "1"
    return queued(tools, name, how, 0)


def scale(tools, widths, rounds):
    """{W: {tool: (ms per handoff, context switches per waiter, (commands, clients') per
    handoff or None)}}, medians over `rounds` rounds (more for small W) in which the tools
    take turns."""
    contenders = [("fair", tools.locked_run, "redis"), ("--no-fair", tools.no_fair, "redis"),
                  ("flock", tools.flock, "flock"), ("etcdctl lock", tools.etcdctl, "etcd"),
                  ("locked-run etcd", tools.etcd, "etcd")]
    results = {}
    serial = 0
    for width in widths:
        samples = {label: [] for label, _, _ in contenders}
        # A narrow round is one handoff or a few, within the noise of one process start: more
        # of them, so that the median says something (at least 16 handoffs a tool).
        for _ in range(max(rounds, -(-16 // width)) if rounds > 1 else rounds):
            for label, make, how in contenders:
                serial += 1
                samples[label].append(one_round(tools, label, make, how, width, serial))
        results[width] = {}
        for label, found in samples.items():
            per = statistics.median(s[0] for s in found)
            wakes = statistics.median(s[1] for s in found)
            commands = None
            if found[0][2] is not None:
                commands = tuple(statistics.median(s[2][i] for s in found) for i in range(2))
            results[width][label] = (per, wakes, commands)
    return results


def scale_table(say, results):
    say("| W | fair ms/handoff (x flock) | `--no-fair` | flock | etcdctl lock | `etcd://` "
        "| commands/handoff fair: sent (with the scripts') | `--no-fair` | context switches/waiter fair "
        "| `--no-fair` | flock | etcdctl | `etcd://` |")
    say("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    verdicts = []
    for width, r in results.items():
        fa, nf, fl, et, ed = r["fair"], r["--no-fair"], r["flock"], r["etcdctl lock"], r["locked-run etcd"]
        say(f"| {width} | {fa[0] * 1000:.2f} ({fa[0] / fl[0]:.2f}x) | {nf[0] * 1000:.2f} ({nf[0] / fl[0]:.2f}x) "
            f"| {fl[0] * 1000:.2f} | {et[0] * 1000:.2f} | {ed[0] * 1000:.2f} "
            f"| {fa[2][1]:.1f} ({fa[2][0]:.1f}) | {nf[2][1]:.1f} ({nf[2][0]:.1f}) "
            f"| {fa[1]:.1f} | {nf[1]:.1f} | {fl[1]:.1f} | {et[1]:.1f} | {ed[1]:.1f} |")
        verdicts.append((width, fa, nf, fl, et))
    return verdicts


def readers(tools, width, rounds):
    """`width` waiters queued behind an exclusive holder, each running `sleep 0.05`: `--shared`
    ones (admitted together when it lets go) against exclusive ones (one after another).
    {label: seconds from the release to the last waiter's end}, medians over `rounds`."""
    samples = {"--shared": [], "exclusive": []}
    serial = 0
    for _ in range(rounds):
        for label, make in (("--shared", tools.shared), ("exclusive", tools.locked_run)):
            serial += 1
            per, _, _ = one_round(tools, f"readers-{label}", make, "redis", width, serial,
                                  hold=tools.locked_run, work=("sleep", "0.05"))
            samples[label].append(per * width)
    return {label: statistics.median(found) for label, found in samples.items()}
