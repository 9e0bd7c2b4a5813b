//! A redis-server the nemesis may freeze, kill and restart: a fixed port and a fixed directory
//! with `--appendonly yes --appendfsync always`, so a restart keeps every acknowledged write
//! (within the single-server guarantee), or restarts empty on request (beyond it).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::support::server::server_bin;
use crate::support::{free_port, server_kind, signal};

pub struct Server {
    pub port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Server {
    pub fn start() -> Server {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut server = Server {
            port: free_port(),
            dir,
            child: None,
        };
        server.spawn();
        server
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Starts the server on its port and directory and waits until it answers (retrying: a
    /// port just freed by a SIGKILL may take a moment to bind again).
    fn spawn(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let mut cmd = Command::new(server_bin());
            cmd.args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
                .args([
                    "--save",
                    "",
                    "--appendonly",
                    "yes",
                    "--appendfsync",
                    "always",
                ])
                .arg("--dir")
                .arg(self.dir.path())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            if server_kind().version.0 >= 7 {
                cmd.args(["--enable-debug-command", "yes"]);
            }
            let mut child = cmd.spawn().expect("redis-server is installed");
            if answers(self.port, &mut child) {
                self.child = Some(child);
                return;
            }
            let _ = child.kill();
            let _ = child.wait();
            assert!(
                Instant::now() < deadline,
                "redis-server did not come back on port {}",
                self.port
            );
            thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn pid(&self) -> Option<i32> {
        self.child.as_ref().map(|c| c.id() as i32)
    }

    pub fn pause(&self) {
        if let Some(pid) = self.pid() {
            signal(pid, libc::SIGSTOP);
        }
    }

    pub fn resume(&self) {
        if let Some(pid) = self.pid() {
            signal(pid, libc::SIGCONT);
        }
    }

    /// SIGKILL; connections are refused until [`Server::restart`].
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            signal(child.id() as i32, libc::SIGCONT);
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again with the data its append-only file kept.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Starts it again with nothing: every key, the fence counters among them, is gone.
    pub fn restart_empty(&mut self) {
        self.kill();
        let dir = self.dir.path().to_owned();
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path: PathBuf = entry.path();
            let _ = std::fs::remove_dir_all(&path).or_else(|_| std::fs::remove_file(&path));
        }
        self.spawn();
    }

    /// `DEBUG SLEEP`: the server answers nothing for `for_` (sent on a connection of its own;
    /// this returns when the server is awake again).
    pub fn debug_sleep(&self, for_: Duration) {
        if let Ok(mut conn) = self.conn() {
            let _ = redis::cmd("DEBUG")
                .arg("SLEEP")
                .arg(format!("{:.3}", for_.as_secs_f64()))
                .query::<redis::Value>(&mut conn);
        }
    }

    pub fn conn(&self) -> redis::RedisResult<redis::Connection> {
        let client = redis::Client::open(self.url())?;
        let conn = client.get_connection_with_timeout(Duration::from_secs(2))?;
        conn.set_read_timeout(Some(Duration::from_secs(10)))?;
        Ok(conn)
    }

    /// Every key on the server with its PTTL.
    pub fn keys(&self) -> redis::RedisResult<Vec<(String, i64)>> {
        let mut conn = self.conn()?;
        let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn)?;
        let mut out = Vec::new();
        for key in keys {
            let pttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut conn)?;
            out.push((key, pttl));
        }
        out.sort();
        Ok(out)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Waits until the server on `port` answers PING (false if it exited).
fn answers(port: u16, child: &mut Child) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return false;
        }
        let url = format!("redis://127.0.0.1:{port}");
        if let Ok(client) = redis::Client::open(url) {
            if let Ok(mut conn) = client.get_connection_with_timeout(Duration::from_millis(200)) {
                // LOADING while the append-only file is read back: not up yet.
                if redis::cmd("PING").query::<String>(&mut conn).is_ok() {
                    return true;
                }
            }
        }
        thread::sleep(Duration::from_millis(10));
    }
    false
}
