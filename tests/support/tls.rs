//! What the secured topologies ([`super::sentinel::SecuredWatched`],
//! [`super::cluster::SecuredCluster`]) are made of: the certificates their servers trust and
//! show ([`Trust`]), TLS-only servers with ACL users and no default user ([`secured_node`],
//! [`TlsProcess`]), and `redis-cli` over TLS.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use super::certs::Certs;
use super::path_str;
use super::server::{cli_bin, free_port, server_bin};

/// The data nodes' ACL user of the secured fixtures.
pub const DATA_USER: &str = "locker";
pub const DATA_PASS: &str = "data-node-secret";
/// The sentinels' own ACL user, apart from the data nodes'.
pub const SENTINEL_USER: &str = "watcher";
pub const SENTINEL_PASS: &str = "sentinel-secret";

/// A TLS-only server process of a secured fixture (its port is the TLS port), killed on drop.
pub struct TlsProcess {
    pub port: u16,
    child: Child,
}

impl Drop for TlsProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl TlsProcess {
    /// Starts `redis-server ARGS` (a config file, or options) on a TLS port it is given, and
    /// waits until `ready` (asked with the port) says it answers.
    pub fn start(args: impl Fn(u16) -> Vec<String>, ready: impl Fn(u16) -> bool) -> TlsProcess {
        for _ in 0..10 {
            let port = free_port();
            let child = Command::new(server_bin())
                .args(args(port))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server is installed");
            let mut process = TlsProcess { port, child };
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                if let Ok(Some(_)) = process.child.try_wait() {
                    break; // the port was taken meanwhile: try another
                }
                if ready(port) {
                    return process;
                }
                assert!(
                    Instant::now() < deadline,
                    "TLS server on {port} did not answer"
                );
                thread::sleep(Duration::from_millis(20));
            }
        }
        panic!("could not start a TLS redis-server");
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }
}

/// `redis-cli` over TLS (trusting `ca`, with the tests' client certificate) as `user`, to
/// `port`.
pub fn tls_cli(certs: &Certs, ca: &Path, port: u16, user: (&str, &str), args: &[&str]) -> String {
    let out = Command::new(cli_bin())
        .args(["--tls", "--cacert", path_str(ca)])
        .args(["--cert", path_str(&certs.client_cert)])
        .args(["--key", path_str(&certs.client_key)])
        .args(["--user", user.0, "--pass", user.1, "--no-auth-warning"])
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The certificates of a secured fixture: the tests' [`Certs`], and what the servers trust and
/// show (the data nodes may show a certificate of the other CA, which every server trusts
/// and the client, given only the tests' CA, does not).
pub struct Trust {
    pub certs: Certs,
    /// What the servers trust: the tests' CA, and the other one too when the data nodes
    /// show its certificate.
    pub servers_ca: PathBuf,
    /// The data nodes' certificate and key.
    pub node_cert: PathBuf,
    pub node_key: PathBuf,
}

impl Trust {
    /// With `other_ca`, the data nodes' certificate is signed by the other CA.
    pub fn make(other_ca: bool) -> Trust {
        let certs = Certs::make();
        if !other_ca {
            return Trust {
                servers_ca: certs.ca.clone(),
                node_cert: certs.server_cert.clone(),
                node_key: certs.server_key.clone(),
                certs,
            };
        }
        let d = certs.dir.path();
        let openssl = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(d)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        openssl(&[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            "node.key",
            "-out",
            "node.csr",
            "-subj",
            "/CN=node",
        ]);
        openssl(&[
            "x509",
            "-req",
            "-in",
            "node.csr",
            "-CA",
            "other-ca.crt",
            "-CAkey",
            "other-ca.key",
            "-CAcreateserial",
            "-out",
            "node.crt",
            "-days",
            "2",
            "-extfile",
            "san.ext",
        ]);
        let bundle = format!(
            "{}{}",
            std::fs::read_to_string(&certs.ca).unwrap(),
            std::fs::read_to_string(&certs.other_ca).unwrap()
        );
        std::fs::write(d.join("both-cas.crt"), bundle).unwrap();
        Trust {
            servers_ca: d.join("both-cas.crt"),
            node_cert: d.join("node.crt"),
            node_key: d.join("node.key"),
            certs,
        }
    }

    /// `redis-cli` over TLS to `port` as `user`.
    pub fn cli(&self, port: u16, user: (&str, &str), args: &[&str]) -> String {
        tls_cli(&self.certs, &self.servers_ca, port, user, args)
    }

    /// `--tls-ca-cert` (the tests' CA only), `--tls-cert`, `--tls-key`.
    pub fn client_args(&self) -> Vec<String> {
        vec![
            "--tls-ca-cert".into(),
            path_str(&self.certs.ca).into(),
            "--tls-cert".into(),
            path_str(&self.certs.client_cert).into(),
            "--tls-key".into(),
            path_str(&self.certs.client_key).into(),
        ]
    }
}

/// TLS options every secured server takes: TLS only, client certificates required (so that
/// `--tls-cert`/`--tls-key` must reach every hop), TLS between the servers too.
fn tls_server_args(trust: &Trust, cert: &Path, key: &Path, port: u16) -> Vec<String> {
    [
        "--port",
        "0",
        "--tls-port",
        &port.to_string(),
        "--tls-cert-file",
        path_str(cert),
        "--tls-key-file",
        path_str(key),
        "--tls-ca-cert-file",
        path_str(&trust.servers_ca),
        "--tls-auth-clients",
        "yes",
        "--tls-replication",
        "yes",
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// A TLS-only data node with the ACL user [`DATA_USER`] and no default user.
pub fn secured_node(trust: &Trust, dir: &Path, extra: &[&str]) -> TlsProcess {
    TlsProcess::start(
        |port| {
            let mut args = tls_server_args(trust, &trust.node_cert, &trust.node_key, port);
            args.extend(
                [
                    "--dir",
                    path_str(dir),
                    // Each word apart: one argument would be a user name with spaces.
                    "--user",
                    "default",
                    "off",
                    "--user",
                    DATA_USER,
                    "on",
                    &format!(">{DATA_PASS}"),
                    "~*",
                    "&*",
                    "+@all",
                    "--masteruser",
                    DATA_USER,
                    "--masterauth",
                    DATA_PASS,
                ]
                .map(str::to_owned),
            );
            args.extend(extra.iter().map(|s| s.to_string()));
            args
        },
        |port| trust.cli(port, (DATA_USER, DATA_PASS), &["PING"]).trim() == "PONG",
    )
}
