"""The benchmark's PostgreSQL server: Debian's `postgresql` package, a cluster of its own made by
initdb in a scratch directory, run on a free loopback port as the package's `postgres` user
when the benchmark runs as root (the server refuses root), and killed with the benchmark.

Settings: trust authentication on loopback; `fsync=off` (like the benchmark's redis-server,
which persists nothing: the figures are the lock's protocol, not the disk's; the lock's
transactions still say `synchronous_commit = on`); `max_connections=400` (every holder and waiter
keeps one); `pg_stat_statements` loaded, which counts every statement the lock's role runs (each
of a multi-statement string on its own). The lock runs as the role `lr`, owner of the database
`lock`; the benchmark's own queries run as `postgres`, so they are not counted.
"""

import ctypes
import os
import pwd
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

OWNER = "postgres"
ROLE = "lr"


def bin_dir():
    """The newest /usr/lib/postgresql/N/bin with a server."""
    found = sorted((p for p in Path("/usr/lib/postgresql").glob("*/bin") if (p / "postgres").exists()),
                   key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0)
    if not found:
        sys.exit("bench: no /usr/lib/postgresql/*/bin/postgres (bench/run installs Debian's postgresql)")
    return found[-1]


def as_owner():
    """What a child runs as: the package's user when this runs as root, else this user. The
    server also dies with the benchmark's thread that started it (PR_SET_PDEATHSIG)."""
    ids = None
    if os.geteuid() == 0:
        entry = pwd.getpwnam(OWNER)
        ids = (entry.pw_uid, entry.pw_gid)

    def setup():
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if ids:
            os.setgroups([])
            os.setgid(ids[1])
            os.setuid(ids[0])

    return ids, setup


class Postgres:
    """A server in a directory of its own (the server's user must own it, which a scratch
    directory made by root for the rest does not allow)."""

    def __init__(self, port):
        self.port = port
        self.bin = bin_dir()
        self.dir = Path(tempfile.mkdtemp(prefix="locked-run-bench-pg-"))
        ids, setup = as_owner()
        if ids:
            os.chown(self.dir, *ids)
        data = self.dir / "data"
        subprocess.run([str(self.bin / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-N",
                        "-E", "UTF8", "--locale=C"], preexec_fn=setup, cwd="/tmp", check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
        self.log = open(self.dir / "log", "w")
        self.proc = subprocess.Popen(
            [str(self.bin / "postgres"), "-D", str(data), "-p", str(port), "-k", str(self.dir),
             "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "max_connections=400",
             "-c", "shared_preload_libraries=pg_stat_statements", "-c", "pg_stat_statements.max=10000",
             "-c", "pg_stat_statements.track_utility=on"],
            preexec_fn=setup, cwd="/tmp", stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.log)
        deadline = time.monotonic() + 30
        while self.query("SELECT 1", db="postgres", check=False) != "1":
            if time.monotonic() > deadline or self.proc.poll() is not None:
                sys.exit(f"bench: PostgreSQL did not start: {(self.dir / 'log').read_text()[-2000:]}")
            time.sleep(0.05)
        self.query(f"CREATE ROLE {ROLE} LOGIN", db="postgres")
        self.query(f"CREATE DATABASE lock OWNER {ROLE}", db="postgres")
        self.query("CREATE EXTENSION pg_stat_statements", db="lock")
        self.url = f"postgres://{ROLE}@127.0.0.1:{port}/lock?sslmode=disable"

    def query(self, sql, db="lock", check=True):
        """`psql -tA -c SQL` as the superuser: its output, stripped."""
        out = subprocess.run(["psql", "-X", "-q", "-tA", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres",
                              "-d", db, "-v", "ON_ERROR_STOP=1", "-c", sql],
                             capture_output=True, text=True, timeout=60)
        if check and out.returncode != 0:
            sys.exit(f"bench: psql {sql!r}: {out.stderr.strip()}")
        return out.stdout.strip()

    def version(self):
        return self.query("SHOW server_version", db="postgres").split(" ")[0]

    def counts(self):
        """(statements, grant attempts, lock transactions, notifications) the lock's role ran so
        far: every statement; the grant's verdict statement (one per attempt, known by its
        column `exclusive_ahead`: pg_stat_statements shows constants as `$1`); the statements
        that open each of its transactions (the prologue's first `SET LOCAL`); the rows of the
        release's wake statement (one per `pg_notify`, each waking one waiter)."""
        out = self.query(
            "SELECT coalesce(sum(calls), 0), "
            "coalesce(sum(calls) FILTER (WHERE query LIKE '%AS exclusive_ahead%'), 0), "
            "coalesce(sum(calls) FILTER (WHERE query LIKE 'SET LOCAL statement_timeout%'), 0), "
            "coalesce(sum(rows) FILTER (WHERE query LIKE '%pg_notify(%'), 0) "
            f"FROM pg_stat_statements s JOIN pg_roles r ON r.oid = s.userid WHERE r.rolname = '{ROLE}'")
        return tuple(int(x) for x in out.split("|"))

    def holds(self, name):
        """Whether a live holder row of `name` is there."""
        return self.query(f"SELECT count(*) FROM locked_run.holder WHERE name = '{name}' "
                          "AND expires_at > clock_timestamp()", check=False) not in ("", "0")

    def queued(self, name, count):
        """Whether `count` live queue places of `name` are there."""
        out = self.query(f"SELECT count(*) FROM locked_run.queue WHERE name = '{name}' "
                         "AND alive_until > clock_timestamp()", check=False)
        return out.isdigit() and int(out) >= count

    def stop(self):
        """An immediate shutdown (SIGQUIT), SIGKILL should it linger."""
        self.proc.send_signal(signal.SIGQUIT)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        subprocess.run(["rm", "-rf", str(self.dir)])


class Bouncer:
    """PgBouncer in transaction pooling in front of `pg`: its server connections outlive each
    run, so a run pays neither the server's fork nor a fresh session's cold caches (waiting
    through it falls back on polling: only the uncontended overhead is measured)."""

    def __init__(self, pg, port):
        self.port = port
        ids, setup = as_owner()
        (pg.dir / "users.txt").write_text(f'"{ROLE}" ""\n')
        (pg.dir / "bouncer.ini").write_text(
            f"[databases]\nlock = host=127.0.0.1 port={pg.port} dbname=lock user={ROLE}\n"
            f"[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {pg.dir}/users.txt\npool_mode = transaction\n"
            f"default_pool_size = 4\nmax_client_conn = 100\n")
        if ids:
            for f in ("users.txt", "bouncer.ini"):
                os.chown(pg.dir / f, *ids)
        self.proc = subprocess.Popen(["pgbouncer", str(pg.dir / "bouncer.ini")], preexec_fn=setup, cwd="/tmp",
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=pg.log)
        deadline = time.monotonic() + 30
        while subprocess.run(["psql", "-X", "-tA", "-h", "127.0.0.1", "-p", str(port), "-U", ROLE, "-d", "lock",
                              "-c", "SELECT 1"], capture_output=True, text=True, timeout=30).stdout.strip() != "1":
            if time.monotonic() > deadline or self.proc.poll() is not None:
                sys.exit("bench: PgBouncer did not start")
            time.sleep(0.05)
        self.url = f"postgres://{ROLE}@127.0.0.1:{port}/lock?sslmode=disable"

    def stop(self):
        self.proc.kill()
        self.proc.wait()
