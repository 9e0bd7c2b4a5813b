"""The redis crate against the own client (examples/client_cost.rs, built here): one uncontended
run on each, side by side."""

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def ms(seconds):
    return f"{seconds * 1000:.2f} ms"


CLIENTS = [
    ("own", "own client (src/redis: RESP3, `HELLO 3` in the acquire's write)"),
    ("redis-crate", "redis crate 1.x, `MultiplexedConnection`, RESP2, no `CLIENT SETINFO`"),
    ("redis-crate-resp3", "redis crate 1.x, `MultiplexedConnection`, RESP3 (`HELLO 3` first)"),
]


def build_client_cost():
    """examples/client_cost.rs: one binary, one uncontended run per process on either client."""
    subprocess.run(["cargo", "build", "--release", "--quiet", "--example", "client_cost"], cwd=ROOT, check=True)
    return ROOT / "target/release/examples/client_cost"


def client_cost(tools, client_binary, rounds, runs, warmup, samples):
    """One uncontended run (connect, acquire, `true`, release) on the own client and on the redis
    crate, in fresh processes, with `locked-run NAME -- true` and `true` alongside. Wall time
    twice: by hyperfine, the commands taking turns in `rounds` rounds of `runs` each as in
    `overhead`; and run by run, `samples` times, the commands taking turns in a rotating order
    so that each client's run can be paired with the own client's run next to it (a machine
    whose speed drifts then moves both alike). Those runs also give the CPU time (user + system)
    and the page faults (both from wait4, which counts `true`'s too, alike for all) and the
    clients' peak RSS (VmHWM, which client_cost prints when asked: wait4's ru_maxrss would count
    this Python process's memory, which a spawned process starts from)."""
    url = f"redis://127.0.0.1:{tools.servers.redis_port}"
    commands = [(mode, [str(client_binary), mode, url, "bench-clients"]) for mode, _ in CLIENTS]
    commands.append(("locked-run", tools.locked_run("bench-clients", "true")))
    commands.append(("true", [shutil.which("true")]))
    for name, cmd in commands:  # each must work (a failed acquire exits non-zero) before it is timed
        subprocess.run(cmd, check=True)
    out = tools.scratch / "clients.json"
    times = {name: [] for name, _ in commands}
    for _ in range(rounds):
        subprocess.run(["hyperfine", "-N", "--style", "none", "--warmup", str(warmup), "--runs", str(runs),
                        "--export-json", str(out), *(" ".join(cmd) for _, cmd in commands)],
                       check=True, stdout=subprocess.DEVNULL)
        for (name, _), result in zip(commands, json.loads(out.read_text())["results"]):
            times[name].extend(result["times"])
    wall = {name: [] for name, _ in commands}
    cpu = {name: [] for name, _ in commands}
    faults = {name: [] for name, _ in commands}
    rss = {name: [] for name, _ in commands}
    env = dict(os.environ, CLIENT_COST_VMHWM="1")
    report = tools.scratch / "vmhwm"
    for i in range(samples):
        for name, cmd in commands[i % len(commands):] + commands[:i % len(commands)]:
            with open(report, "w") as err:
                started = time.perf_counter()
                pid = os.posix_spawn(cmd[0], cmd, env, file_actions=[(os.POSIX_SPAWN_DUP2, err.fileno(), 2)])
                _, status, usage = os.wait4(pid, 0)
                wall[name].append(time.perf_counter() - started)
            if os.waitstatus_to_exitcode(status) != 0:
                sys.exit(f"bench: {' '.join(cmd)} failed")
            cpu[name].append(usage.ru_utime + usage.ru_stime)
            faults[name].append(usage.ru_minflt)
            hwm = [l for l in report.read_text().splitlines() if l.startswith("VmHWM:")]
            if hwm:
                rss[name].append(int(hwm[0].split()[1]))  # kB
    results = {}
    for name, _ in commands:
        paired = sorted(a - b for a, b in zip(wall[name], wall["own"]))
        # A 95% confidence interval of the median, from the order statistics of the pairs.
        half = int(0.98 * len(paired) ** 0.5)
        mid = len(paired) // 2
        results[name] = {"wall": statistics.median(times[name]), "paired": statistics.median(paired),
                         "ci": (paired[max(mid - half, 0)], paired[min(mid + half, len(paired) - 1)]),
                         "cpu": statistics.median(cpu[name]), "faults": statistics.median(faults[name]),
                         "rss": max(rss[name]) if rss[name] else None}
    return results


def client_cost_table(say, k, smoke):
    """The comparison's table. A run's overhead is what bench.py calls overhead above: the median
    wall time of `locked-run NAME -- true`, here measured in the same rounds; the difference's
    share of the part beyond `true`'s time is shown too. The verdict goes by the paired
    difference, which a drifting machine disturbs least."""
    lr, tr = k["locked-run"]["wall"], k["true"]["wall"]
    own = k["own"]
    say("| one uncontended run: connect, acquire, `true`, release | wall median | difference of the medians "
        "| paired difference, median [95% CI] | as % of a run's overhead (of the part beyond `true`) "
        "| CPU median | page faults | peak RSS |")
    say("|---|---|---|---|---|---|---|---|")
    verdicts = []
    for mode, label in CLIENTS:
        m = k[mode]
        if mode == "own":
            say(f"| {label} | {ms(m['wall'])} | - | - | - | {ms(m['cpu'])} | {m['faults']:.0f} "
                f"| {m['rss'] / 1024:.2f} MiB |")
            continue
        diff, paired, (low, high) = m["wall"] - own["wall"], m["paired"], m["ci"]
        share = paired / lr
        say(f"| {label} | {ms(m['wall'])} | {diff * 1000:+.2f} ms "
            f"| {paired * 1000:+.2f} ms [{low * 1000:+.2f}, {high * 1000:+.2f}] "
            f"| {share * 100:+.1f}% ({paired / (lr - tr) * 100:+.1f}%) "
            f"| {ms(m['cpu'])} ({(m['cpu'] - own['cpu']) * 1000:+.2f} ms) "
            f"| {m['faults']:.0f} ({m['faults'] - own['faults']:+.0f}) "
            f"| {m['rss'] / 1024:.2f} MiB ({m['rss'] - own['rss']:+d} KiB) |")
        verdicts.append(f"{mode} {share * 100:+.1f}%: {'within' if share <= 0.05 else 'over'} 5%")
    for name, label in (("locked-run", "`locked-run NAME -- true` (a run's overhead)"), ("true", "`true`")):
        say(f"| {label} | {ms(k[name]['wall'])} | - | - | - | {ms(k[name]['cpu'])} | {k[name]['faults']:.0f} | - |")
    say()
    rule = ("the crate may be adopted where its paired difference is no more than 5% of a run's "
            "overhead; within it, the decision is the design note in docs/how-it-works.md")
    say(f"Rule: {rule}. " + ("(smoke run: no verdict)" if smoke else "; ".join(verdicts) + "."))


def big_reply(runs):
    """examples/resp_parse.rs: one 4 MB reply (an array, a bulk string) read by the own client
    and by the redis crate's parser, over loopback in 4 KiB pieces; its lines, as printed."""
    subprocess.run(["cargo", "build", "--release", "--quiet", "--example", "resp_parse"], cwd=ROOT, check=True)
    out = subprocess.run([str(ROOT / "target/release/examples/resp_parse"), str(runs)],
                         capture_output=True, text=True, check=True, timeout=600).stdout
    return [line.rstrip() for line in out.splitlines() if line.strip()]
