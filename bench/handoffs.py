"""The handoff to one waiter and to a few, for `file://` and `postgres://` beside flock and the
Redis backend, this build against another (`--base BINARY`: the landed build) in the same rounds:
`bench/run --handoffs [--base BINARY]`.

Per handoff at W = 1, 8 and 32: bench/scale.py's rounds (W waiters queued behind a holder; the
time from its release to the last waiter's end, divided by W), the tools taking turns round by
round, medians over the rounds (at least 16 handoffs a tool at each W). W = 1 is the most common
case of all, one cron run waiting behind another, and it counts the last run's own end whole
(its release and its exit), which from W = 8 on is shared out. Uncontended: `X NAME -- true` by
hyperfine, the tools taking turns in rounds.

Targets: `file://` at most 1.3x flock per handoff at every W, and uncontended; `postgres://` at
W = 1 at most 1.6x its own per-handoff time at W = 8 (flock's ratio), which a lone waiter woken
late (by its keep-alive's re-ask rather than the release's notification) would miss.
"""

import json
import statistics
import subprocess
import time

from scale import one_round


def contenders(tools, base):
    """(label, how a run is made, how a round tells who holds and waits), this build's and, with
    `base`, the other build's."""
    found = [("flock", tools.flock, "flock")]
    for suffix, t in (("", tools), (" base", base)):
        if t is None:
            continue
        found += [(f"file{suffix}", t.file, "file"), (f"redis fair{suffix}", t.locked_run, "redis"),
                  (f"postgres{suffix}", t.postgres, "postgres")]
    return found


def handoffs(tools, base, widths, rounds):
    """{W: {label: ms per handoff}}, medians over the rounds."""
    results = {}
    serial = 0
    every = contenders(tools, base)
    for width in widths:
        samples = {label: [] for label, _, _ in every}
        for _ in range(max(rounds, -(-16 // width))):
            for label, make, how in every:
                serial += 1
                per, _, _ = one_round(tools, label, make, how, width, f"h{serial}")
                samples[label].append(per * 1000)
        results[width] = {label: statistics.median(found) for label, found in samples.items()}
    return results


def uncontended(tools, base, rounds, runs, warmup):
    """{label: ms}: the median wall time of `X NAME -- true` for flock and `file://`, by
    hyperfine, the tools taking turns in rounds."""
    every = [("flock", tools.flock), ("file", tools.file)]
    if base is not None:
        every.append(("file base", base.file))
    out = tools.scratch / "uncontended.json"
    commands = [" ".join(make("bench-uncontended", "true")) for _, make in every]
    times = {label: [] for label, _ in every}
    for _ in range(rounds):
        subprocess.run(["hyperfine", "-N", "--style", "none", "--warmup", str(warmup), "--runs", str(runs),
                        "--export-json", str(out), *commands], check=True, stdout=subprocess.DEVNULL)
        for (label, _), result in zip(every, json.loads(out.read_text())["results"]):
            times[label].extend(result["times"])
    return {label: statistics.median(t) * 1000 for label, t in times.items()}


def handoffs_table(say, results, idle, base, smoke):
    """The table the targets are read from, and the verdicts."""
    widths = list(results)
    say("| per handoff | " + " | ".join(f"W = {w}" for w in widths) + " | uncontended |")
    say("|---|" + "---|" * (len(widths) + 1))
    rows = ["flock", "file", "file base", "redis fair", "redis fair base", "postgres", "postgres base"]
    for label in rows:
        if label not in results[widths[0]]:
            continue
        cells = []
        for w in widths:
            ms, flock = results[w][label], results[w]["flock"]
            cells.append(f"{ms:.2f} ms" if label == "flock" else f"{ms:.2f} ({ms / flock:.2f}x)")
        lone = idle.get(label)
        shown = "-" if lone is None else (
            f"{lone:.2f} ms" if label == "flock" else f"{lone:.2f} ({lone / idle['flock']:.2f}x)")
        name = label.replace(" base", " (base build)")
        say(f"| {name} | " + " | ".join(cells) + f" | {shown} |")
    say()
    if smoke:
        say("Targets: (smoke run: no verdict)")
        return
    for suffix in ("",) + ((" base",) if base else ()):
        file_ok = all(results[w][f"file{suffix}"] <= 1.3 * results[w]["flock"] for w in widths)
        idle_ok = idle[f"file{suffix}"] <= 1.3 * idle["flock"]
        pg = f"postgres{suffix}"
        lone = results[1][pg] / results[8][pg] if 1 in results and 8 in results else float("nan")
        say(f"Targets{' for the base build' if suffix else ''}: `file://` <= 1.3x flock at every W: "
            f"{verdict(file_ok)}; uncontended <= 1.3x flock: {verdict(idle_ok)}; `postgres://` at W = 1 <= "
            f"1.6x its W = 8 ({lone:.2f}x): {verdict(lone <= 1.6)}.")


def verdict(ok):
    return "meets" if ok else "MISSES"


def measure_handoffs(args, base, tools, say, machine):
    """`bench/run --handoffs`: measures, then says the table."""
    smoke = args.smoke
    if base:
        subprocess.run(base.postgres("bench-init", "true"), check=True)
    idle = uncontended(tools, base, rounds=1 if smoke else 5, runs=3 if smoke else 100, warmup=1 if smoke else 5)
    h = handoffs(tools, base, (1, 8) if smoke else (1, 8, 32), 1 if smoke else args.rounds)
    say(f"Machine: {machine()}")
    say(f"Date: {time.strftime('%Y-%m-%d %H:%M')}{' (smoke run, not a measurement)' if smoke else ''}")
    say(f"This build: {args.shown}")
    say()
    handoffs_table(say, h, idle, base, smoke)
