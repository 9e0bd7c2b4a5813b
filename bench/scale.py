"""The scale section of the benchmark: hundreds of waiters on one NAME.

A holder takes NAME; W waiters queue behind it, each to run `true` once it has the lock; the
holder lets go (its command reads a line from a FIFO, which the benchmark writes), and the clock
runs until the last waiter has ended. Per handoff: the total over W, the server commands (Redis's
`INFO stats` and `INFO commandstats`: every command, those the scripts run included, and the
ones the clients sent), and the waiters' voluntary context switches (wait4), which count how
often each waiter process was woken: flat in W when a release wakes one waiter, growing with W
when every release reaches every waiter.

The Redis backends also run W = 300 (the full run only; fair, `--no-fair` and flock), and one more
round per W counts the commands the clients send by MONITOR (which shows a script's own calls
apart, as `lua`): fair and `--no-fair`, untimed, since MONITOR slows the server. postgres://
runs W = 1, 8, 32, 96 beside them, counted by pg_stat_statements (bench/postgres.py): the
statements of the lock's role, its grant attempts and its transactions, per handoff.
"""

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

# How long a round lets the processes that checked the queue end before it times the handoff.
SETTLE = 0.1

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


def counts(tools, how):
    """The server's counters a round reads before and after, or None."""
    if how == "redis":
        return redis_counts(tools)
    if how == "postgres":
        return tools.servers.pg.counts()
    return None


# What the benchmark itself sends while a round runs (its connections are left out of MONITOR's count).
OWN = {"ZCARD", "EXISTS", "INFO", "MONITOR"}


def client_commands(path):
    """The commands clients sent, from MONITOR's output (a script's calls, `[0 lua]`, left out;
    so are the benchmark's own connections)."""
    sent = {}
    own = set()
    for line in Path(path).read_text().splitlines():
        if "[" not in line or " lua]" in line:
            continue
        who, rest = line.split("[", 1)[1].split("] ", 1)
        command = rest.split(" ", 1)[0].strip('"').upper()
        if command in OWN:
            own.add(who)
        sent.setdefault(who, []).append(command)
    return sum(len(commands) for who, commands in sent.items() if who not in own)


def queued(tools, name, how, count):
    """Whether `count` waiters wait for `name`, by the evidence each tool leaves."""
    if how == "postgres":
        return tools.servers.pg.queued(name, count)
    if how == "redis":
        out = subprocess.run(["redis-cli", "-p", str(tools.servers.redis_port), "ZCARD", f"queue:{{{name}}}"],
                             capture_output=True, text=True).stdout.strip()
        return out.isdigit() and int(out) >= count
    if how == "etcd":
        out = subprocess.run(["etcdctl", f"--endpoints={tools.servers.etcd}", "get", "--prefix", "--keys-only",
                              f"{name}/"], capture_output=True, text=True).stdout
        return len([l for l in out.splitlines() if l.strip()]) >= count + 1
    if how in ("flock", "file"):
        # Blocked flock requests are the `->` lines of /proc/locks: for flock, on the lock file;
        # for file://, on its lock file (the head of the queue) and the places (the others).
        blocked = [inode for inode, waits in proc_locks() if waits]
        return sum(1 for inode in blocked if inode in lock_inodes(tools, name, how)) >= count
    raise ValueError(how)


def proc_locks():
    """(inode, blocked) of each flock in /proc/locks."""
    found = []
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        waits = len(fields) > 1 and fields[1] == "->"
        if waits:
            fields.pop(1)
        if len(fields) > 5 and fields[1] == "FLOCK":
            found.append((int(fields[5].rsplit(":", 1)[1]), waits))
    return found


def lock_inodes(tools, name, how):
    """The inodes of the files a lock `name` is taken on: flock's file; file://'s lock file and
    queue places (`NAME.lock`, `NAME.wait.*`)."""
    if how == "flock":
        paths = [tools.scratch / f"{name}.flock"]
    else:
        paths = [p for p in (tools.scratch / "locks").glob(f"{name}.*") if p.suffix != ".history"]
    inodes = set()
    for path in paths:
        try:
            inodes.add(path.stat().st_ino)
        except OSError:
            pass
    return inodes


def one_round(tools, label, make, how, width, serial, hold=None, work=("true",), monitor=False):
    """One round: `hold` (default `make`) holds, W waiters made by `make` queue and run `work`.
    With `monitor`, the commands the clients sent from the holder's hold on, by MONITOR, take
    the place of the server's counters."""
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
    watch = None
    if monitor:
        out = tools.scratch / f"{name}.monitor"
        watch = subprocess.Popen(["redis-cli", "-p", str(tools.servers.redis_port), "MONITOR"],
                                 stdout=open(out, "w"))
        deadline = time.monotonic() + 10
        while "OK" not in out.read_text():
            if time.monotonic() > deadline:
                sys.exit("bench: MONITOR did not start")
            time.sleep(0.005)
    before = counts(tools, how)
    waiters = [os.posix_spawnp(cmd[0], cmd, os.environ) for cmd in [make(name, *work)] * width]
    deadline = time.monotonic() + 60
    while not queued(tools, name, how, width):
        if time.monotonic() > deadline:
            sys.exit(f"bench: {width} {label} waiters did not queue on {name}")
        time.sleep(0.01)
    # The processes that looked (psql and its server process, redis-cli, etcdctl) end before
    # the clock starts: a server process still exiting beside the handoff was counted in it,
    # whole at W = 1 (some 5 ms of postgres://'s there), an eighth of it at W = 8.
    time.sleep(SETTLE)
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
    after = counts(tools, how)
    fifo.unlink()
    commands = [(a - b) / width for a, b in zip(after, before)] if before is not None else None
    if watch:
        time.sleep(0.1)  # what the server wrote reaches the file
        watch.terminate()
        watch.wait(timeout=10)
        commands = [client_commands(out) / width]
        out.unlink()
    return total / width, statistics.mean(switches), commands


def holds(tools, name, how):
    if how == "postgres":
        return tools.servers.pg.holds(name)
    if how == "redis":
        out = subprocess.run(["redis-cli", "-p", str(tools.servers.redis_port), "EXISTS", f"lock:{{{name}}}"],
                             capture_output=True, text=True).stdout.strip()
        return out == "1"
    if how == "etcd":
        return queued(tools, name, how, 0)
    # flock and file://: a granted (not blocked) flock on the lock file.
    held = [inode for inode, waits in proc_locks() if not waits]
    lock = tools.scratch / (f"{name}.flock" if how == "flock" else f"locks/{name}.lock")
    try:
        return lock.stat().st_ino in held
    except OSError:
        return False


def scale(tools, widths, rounds):
    """{W: {tool: (ms per handoff, context switches per waiter, counts per handoff or None)}},
    medians over `rounds` rounds (more for small W) in which the tools take turns; the counts:
    Redis's (commands, clients'), postgres's (statements, grant attempts, transactions), and
    under "sent fair" / "sent --no-fair" MONITOR's count of the commands clients sent. W above
    96: the Redis backends and flock only."""
    every = [("fair", tools.locked_run, "redis"), ("--no-fair", tools.no_fair, "redis"),
             ("flock", tools.flock, "flock"), ("etcdctl lock", tools.etcdctl, "etcd"),
             ("locked-run etcd", tools.etcd, "etcd"), ("postgres", tools.postgres, "postgres")]
    results = {}
    serial = 0
    for width in widths:
        contenders = [c for c in every if width <= 96 or c[2] in ("redis", "flock")]
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
                commands = tuple(statistics.median(s[2][i] for s in found) for i in range(len(found[0][2])))
            results[width][label] = (per, wakes, commands)
        for label, make in (("fair", tools.locked_run), ("--no-fair", tools.no_fair)):
            serial += 1
            _, _, sent = one_round(tools, label, make, "redis", width, serial, monitor=True)
            results[width][f"sent {label}"] = sent[0]
    return results


def scale_table(say, results):
    """The Redis backends against flock and etcd; `-` where a tool did not run at that W."""
    say("| W | fair ms/handoff (x flock) | `--no-fair` | flock | etcdctl lock | `etcd://` "
        "| commands/handoff fair: sent (with the scripts') | `--no-fair` "
        "| sent by MONITOR: fair | `--no-fair` | context switches/waiter fair "
        "| `--no-fair` | flock | etcdctl | `etcd://` |")
    say("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    verdicts = []

    def cell(r, label, i, form="{:.1f}", scale=1):
        return form.format(r[label][i] * scale) if label in r else "-"

    for width, r in results.items():
        fa, nf, fl = r["fair"], r["--no-fair"], r["flock"]
        say(f"| {width} | {fa[0] * 1000:.2f} ({fa[0] / fl[0]:.2f}x) | {nf[0] * 1000:.2f} ({nf[0] / fl[0]:.2f}x) "
            f"| {fl[0] * 1000:.2f} | {cell(r, 'etcdctl lock', 0, '{:.2f}', 1000)} "
            f"| {cell(r, 'locked-run etcd', 0, '{:.2f}', 1000)} "
            f"| {fa[2][1]:.1f} ({fa[2][0]:.1f}) | {nf[2][1]:.1f} ({nf[2][0]:.1f}) "
            f"| {r['sent fair']:.1f} | {r['sent --no-fair']:.1f} "
            f"| {fa[1]:.1f} | {nf[1]:.1f} | {fl[1]:.1f} | {cell(r, 'etcdctl lock', 1)} "
            f"| {cell(r, 'locked-run etcd', 1)} |")
        verdicts.append((width, fa, nf, fl, r.get("etcdctl lock")))
    return verdicts


def postgres_table(say, results):
    """postgres:// beside Redis's fair waiters: time, and what the server ran, per handoff.
    Every waiter's first attempt queues it; each later one follows a notification (a wake-up: a
    release names the one waiter whose turn it is) or the keep-alive's re-ask every 2/3 s, which
    a round longer than that brings in whatever the releases do."""
    say("| W | `postgres://` ms/handoff (x Redis fair, x flock) | statements/handoff | transactions/handoff "
        "| grant attempts/handoff | wake-ups (notifications)/handoff | keep-alive re-asks/handoff "
        "| context switches/waiter |")
    say("|---|---|---|---|---|---|---|---|")
    rows = []
    for width, r in results.items():
        if "postgres" not in r:
            continue
        pg, fa, fl = r["postgres"], r["fair"], r["flock"]
        statements, attempts, transactions, notified = pg[2]
        say(f"| {width} | {pg[0] * 1000:.2f} ({pg[0] / fa[0]:.2f}x, {pg[0] / fl[0]:.2f}x) | {statements:.1f} "
            f"| {transactions:.1f} | {attempts:.2f} | {notified:.2f} | {max(attempts - 1 - notified, 0):.2f} "
            f"| {pg[1]:.1f} |")
        rows.append((width, pg[0], notified))
    return rows


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
