//! Real PostgreSQL for the `postgres://` tests (Debian's `postgresql` package): `initdb` runs
//! once per test process into a template, which each server copies (initdb takes most of a
//! second); each server runs as the `postgres` user (the server refuses root) on a free
//! loopback port with its socket in its data directory, is SIGKILLed should the test's thread
//! die first (PDEATHSIG), and is stopped on drop (SIGQUIT, then SIGKILL). A server that is
//! SIGKILLed (by a test, or because it lingered) has its System V shared memory segment
//! removed: only a server that shuts down removes its own, and one left behind would outlive
//! the test run. Standbys are made with `pg_basebackup`; `psql` runs as the superuser under the
//! hard timeout.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::certs::Certs;
use super::process::{Output, run, signal, wait_timeout, wait_until};
use super::server::free_port;

/// The server's user: the server refuses to run as root.
const OWNER: &str = "postgres";

/// The directory of the server's programs: `LOCKED_RUN_TEST_PG_BIN`, else the newest
/// `/usr/lib/postgresql/*/bin`.
pub fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("LOCKED_RUN_TEST_PG_BIN") {
        return PathBuf::from(dir);
    }
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL is installed (Debian's postgresql package; see .ci/run)")
        .filter_map(|e| Some(e.ok()?.path().join("bin")))
        .filter(|d| d.join("postgres").exists())
        .collect();
    dirs.sort_by_key(|d| {
        d.parent()
            .and_then(|v| v.file_name()?.to_str()?.parse::<u32>().ok())
            .unwrap_or(0)
    });
    dirs.pop()
        .expect("a /usr/lib/postgresql/N/bin with postgres")
}

fn ids() -> (u32, u32) {
    let out = Command::new("id").args(["-u", OWNER]).output().unwrap();
    let uid = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    let out = Command::new("id").args(["-g", OWNER]).output().unwrap();
    let gid = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    (uid, gid)
}

/// `program` of the server's, run as its user, under the hard timeout.
fn as_owner(program: &str, args: &[&str]) -> Output {
    let (uid, gid) = ids();
    let mut cmd = Command::new(bin_dir().join(program));
    cmd.args(args).uid(uid).gid(gid).current_dir("/tmp");
    cmd.stdin(Stdio::null());
    run(cmd)
}

/// A directory the server's user owns (mode 0700).
fn owned_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let (uid, gid) = ids();
    std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    dir
}

/// The template every server copies: one initdb per test process.
fn template() -> &'static Path {
    static TEMPLATE: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    let (_, data) = TEMPLATE.get_or_init(|| {
        let dir = owned_dir();
        let data = dir.path().join("data");
        let data_str = data.to_str().unwrap();
        as_owner(
            "initdb",
            &[
                "-D",
                data_str,
                "-U",
                "postgres",
                "--auth=trust",
                "-N",
                "-E",
                "UTF8",
                "--locale=C",
            ],
        )
        .expect(0);
        (dir, data)
    });
    data
}

/// A server.
pub struct Postgres {
    pub port: u16,
    pub dir: tempfile::TempDir,
    /// Extra `-c` settings it runs with.
    settings: Vec<String>,
    child: Option<Child>,
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Postgres {
    /// A server, answering, that trusts every loopback connection.
    pub fn start() -> Postgres {
        Postgres::start_with(&[])
    }

    /// A server with extra `-c NAME=VALUE` settings.
    pub fn start_with(settings: &[&str]) -> Postgres {
        let dir = owned_dir();
        let data = dir.path().join("data");
        let (uid, gid) = ids();
        let copied = Command::new("cp")
            .arg("-a")
            .arg(template())
            .arg(&data)
            .status()
            .unwrap();
        assert!(copied.success());
        std::os::unix::fs::chown(&data, Some(uid), Some(gid)).unwrap();
        let mut pg = Postgres {
            port: free_port(),
            dir,
            settings: settings.iter().map(|s| s.to_string()).collect(),
            child: None,
        };
        pg.launch();
        pg
    }

    pub fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// `postgres://USER@127.0.0.1:PORT/postgres`, without TLS.
    pub fn url_as(&self, user: &str) -> String {
        format!(
            "postgres://{user}@127.0.0.1:{}/postgres?sslmode=disable",
            self.port
        )
    }

    /// The superuser's URL.
    pub fn url(&self) -> String {
        self.url_as("postgres")
    }

    /// Writes `pg_hba.conf` (then reloads, if running).
    pub fn hba(&self, text: &str) {
        let path = self.data().join("pg_hba.conf");
        std::fs::write(&path, text).unwrap();
        if self.child.is_some() {
            self.psql("SELECT pg_reload_conf()");
        }
    }

    /// Starts the server on its port and data, and waits until it answers.
    pub fn launch(&mut self) {
        self.spawn(&[]);
        self.wait_ready();
    }

    /// Starts the server as a standby with `hot_standby = off`, which takes connections and
    /// refuses each (57P03, "not accepting connections", as a server starting up does), and
    /// waits until it does. [`Postgres::relaunch_as_primary`] ends that.
    #[allow(dead_code)]
    pub fn launch_refusing(&mut self) {
        let signal_file = self.data().join("standby.signal");
        std::fs::write(&signal_file, "").unwrap();
        let (uid, gid) = ids();
        std::os::unix::fs::chown(&signal_file, Some(uid), Some(gid)).unwrap();
        self.spawn(&["hot_standby=off"]);
        wait_until(
            "the server refuses connections",
            Duration::from_secs(30),
            || {
                self.psql_output("SELECT 1")
                    .stderr
                    .contains("not accepting connections")
            },
        );
    }

    /// Stopped, and started again as a primary that answers.
    #[allow(dead_code)]
    pub fn relaunch_as_primary(&mut self) {
        self.stop();
        let _ = std::fs::remove_file(self.data().join("standby.signal"));
        self.launch();
    }

    /// Starts the server, with `extra` settings beside its own, without waiting.
    fn spawn(&mut self, extra: &[&str]) {
        let (uid, gid) = ids();
        let port = self.port.to_string();
        let sock = self.dir.path().to_str().unwrap().to_owned();
        let mut cmd = Command::new(bin_dir().join("postgres"));
        cmd.arg("-D")
            .arg(self.data())
            .args(["-p", &port, "-k", &sock])
            .args(["-c", "listen_addresses=127.0.0.1,127.0.0.2"])
            .args(["-c", "fsync=off", "-c", "max_connections=200"])
            .args(["-c", "shared_buffers=16MB", "-c", "max_wal_senders=5"]);
        for setting in self
            .settings
            .iter()
            .map(String::as_str)
            .chain(extra.iter().copied())
        {
            cmd.args(["-c", setting]);
        }
        cmd.uid(uid).gid(gid).current_dir("/tmp");
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.dir.path().join("log")).unwrap());
        // SAFETY: prctl(2) only, between fork and exec: the server dies with this thread
        // should the test die before it drops the fixture.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        self.child = Some(cmd.spawn().expect("postgres starts"));
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let out = self.psql_output("SELECT 1");
            if out.code() == Some(0) && out.stdout.trim() == "1" {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "PostgreSQL on {} did not start: {}",
                self.port,
                std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The postmaster's pid (the chaos suite pauses the server by it).
    #[allow(dead_code)]
    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("running").id() as i32
    }

    /// SIGKILL (the server's processes follow their postmaster), and reaped; its shared
    /// memory segment removed.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
            self.remove_shared_memory();
            // Its backends end once they see the postmaster gone.
            wait_until(
                "the server's backends to end",
                Duration::from_secs(10),
                || std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err(),
            );
        }
    }

    /// Stopped (SIGQUIT: an immediate shutdown, which removes its shared memory), SIGKILL if
    /// it lingers (then the segment is removed here).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            signal(child.id() as i32, libc::SIGQUIT);
            if wait_timeout(&mut child, Duration::from_secs(10)).is_none() {
                let _ = child.kill();
                let _ = child.wait();
                self.remove_shared_memory();
            }
        }
    }

    /// The server's System V shared memory segment, as its `postmaster.pid` names it (line 7:
    /// the key and the id): `(key, id)`.
    #[allow(dead_code)]
    pub fn shared_memory(&self) -> Option<(i32, i32)> {
        let text = std::fs::read_to_string(self.data().join("postmaster.pid")).ok()?;
        let mut fields = text.lines().nth(6)?.split_whitespace();
        let key = fields.next()?.parse().ok()?;
        let id = fields.next()?.parse().ok()?;
        Some((key, id))
    }

    /// Removes the segment of a server that was SIGKILLed (and cannot remove it itself): at
    /// once if nothing is attached, else when its last backend detaches. Only the segment
    /// that still has the server's key: an id is reused once its segment is gone.
    fn remove_shared_memory(&self) {
        let Some((key, id)) = self.shared_memory() else {
            return;
        };
        // SAFETY: shmid_ds is plain data, filled by IPC_STAT; IPC_RMID reads nothing from it.
        unsafe {
            let mut ds: libc::shmid_ds = std::mem::zeroed();
            if libc::shmctl(id, libc::IPC_STAT, &mut ds) == 0 && ds.shm_perm.__key == key {
                libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut());
            }
        }
    }

    /// `psql -tA -c SQL` as the superuser: its output.
    pub fn psql_output(&self, sql: &str) -> Output {
        let mut cmd = Command::new("psql");
        cmd.args([
            "-X",
            "-q",
            "-tA",
            "-v",
            "ON_ERROR_STOP=1",
            "-h",
            "127.0.0.1",
        ])
        .args([
            "-p",
            &self.port.to_string(),
            "-U",
            "postgres",
            "-d",
            "postgres",
        ])
        .args(["-c", sql]);
        cmd.env_remove("PGPASSWORD").stdin(Stdio::null());
        run(cmd)
    }

    /// `psql -tA -c SQL`, which must succeed: its stdout, trimmed.
    #[track_caller]
    pub fn psql(&self, sql: &str) -> String {
        let out = self.psql_output(sql);
        assert_eq!(out.code(), Some(0), "psql {sql}: {out:?}");
        out.stdout.trim().to_owned()
    }

    /// A standby of this server (`pg_basebackup -R`), streaming, answering.
    pub fn standby(&self) -> Postgres {
        self.standby_named("standby")
    }

    /// [`Postgres::standby`] whose `cluster_name`, the name the server it streams from knows
    /// it by (as `synchronous_standby_names` names it), is `name`.
    pub fn standby_named(&self, name: &str) -> Postgres {
        let dir = owned_dir();
        let data = dir.path().join("data");
        as_owner(
            "pg_basebackup",
            &[
                "-D",
                data.to_str().unwrap(),
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
                "-R",
                "-X",
                "stream",
            ],
        )
        .expect(0);
        let mut standby = Postgres {
            port: free_port(),
            dir,
            settings: vec![format!("cluster_name={name}")],
            child: None,
        };
        standby.launch();
        standby
    }

    /// Promotes a standby, and waits until it is a primary.
    pub fn promote(&self) {
        assert_eq!(self.psql("SELECT pg_promote(true, 30)"), "t");
    }

    /// Turns TLS on with `certs` (the server's certificate and key copied where it reads them).
    pub fn enable_tls(&self, certs: &Certs) {
        let (uid, gid) = ids();
        for (from, to) in [
            (&certs.server_cert, "server.crt"),
            (&certs.server_key, "server.key"),
        ] {
            let path = self.data().join(to);
            std::fs::copy(from, &path).unwrap();
            std::os::unix::fs::chown(&path, Some(uid), Some(gid)).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        self.psql("ALTER SYSTEM SET ssl = on");
        self.psql("SELECT pg_reload_conf()");
    }
}
