//! Certificates for the TLS tests, made with openssl.

use std::path::PathBuf;
use std::process::Command;

/// A test CA, a server certificate for localhost and 127.0.0.1, a client certificate, and a
/// second CA that signed none of them; made with openssl.
pub struct Certs {
    pub dir: tempfile::TempDir,
    pub ca: PathBuf,
    pub other_ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

impl Certs {
    pub fn make() -> Certs {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().to_path_buf();
        let openssl = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(&d)
                .output()
                .expect("openssl is installed (see .ci/run)");
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        for ca in ["ca", "other-ca"] {
            let (key, crt, subject) = (
                format!("{ca}.key"),
                format!("{ca}.crt"),
                format!("/CN=locked-run test {ca}"),
            );
            let mut args = vec!["req", "-x509"];
            args.extend(ec);
            args.extend([
                "-keyout", &key, "-out", &crt, "-days", "2", "-subj", &subject,
            ]);
            openssl(&args);
        }
        std::fs::write(
            d.join("san.ext"),
            "subjectAltName=DNS:localhost,IP:127.0.0.1\n",
        )
        .unwrap();
        for who in ["server", "client"] {
            let (key, csr, crt, subject) = (
                format!("{who}.key"),
                format!("{who}.csr"),
                format!("{who}.crt"),
                format!("/CN={who}"),
            );
            let mut args = vec!["req"];
            args.extend(ec);
            args.extend(["-keyout", &key, "-out", &csr, "-subj", &subject]);
            openssl(&args);
            openssl(&[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &crt,
                "-days",
                "2",
                "-extfile",
                "san.ext",
            ]);
        }
        Certs {
            ca: d.join("ca.crt"),
            other_ca: d.join("other-ca.crt"),
            server_cert: d.join("server.crt"),
            server_key: d.join("server.key"),
            client_cert: d.join("client.crt"),
            client_key: d.join("client.key"),
            dir,
        }
    }
}
