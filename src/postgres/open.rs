//! A PostgreSQL database as the endpoints name it, ready to connect (nothing is connected yet):
//! the hosts, user, database and options of the URL, the password the URL lacks
//! (`--password-file`, `PGPASSWORD`; `~/.pgpass` is read per host when connecting), and TLS as
//! `sslmode` asks, with the URL's files or the `--tls-*` options.

use super::client::Client;
use super::conn::Login;
use super::tls::{self, Files};
use super::url::{self, SslMode};
use crate::endpoints::{Endpoints, PasswordFrom};

/// The variable libpq reads the password from.
pub const PASSWORD_VARIABLE: &str = "PGPASSWORD";

/// The client of the database `url` names.
pub fn client(endpoints: &Endpoints, url: &str) -> Result<Client, String> {
    let parsed = url::parse(url)?;
    let user = parsed.user.clone().unwrap_or_else(os_user);
    let dbname = parsed.dbname.clone().unwrap_or_else(|| user.clone());
    let options = &endpoints.tls;
    let files = Files {
        ca: (parsed.sslrootcert.clone().map(|p| (p, "sslrootcert")))
            .or_else(|| options.ca_cert.clone().map(|p| (p, "--tls-ca-cert"))),
        cert: (parsed.sslcert.clone().map(|p| (p, "sslcert")))
            .or_else(|| options.cert.clone().map(|p| (p, "--tls-cert"))),
        key: (parsed.sslkey.clone().map(|p| (p, "sslkey")))
            .or_else(|| options.key.clone().map(|p| (p, "--tls-key"))),
    };
    let any_file = files.ca.is_some() || files.cert.is_some() || files.key.is_some();
    // A CA given says the server is to be checked: verify-full, unless the URL says otherwise.
    let sslmode = parsed.sslmode.unwrap_or(match files.ca.is_some() {
        true => SslMode::VerifyFull,
        false => SslMode::Prefer,
    });
    if sslmode == SslMode::Disable && any_file {
        // Ignoring them would leave a connection believed encrypted in plain text.
        return Err(crate::text::message!(
            "{} says sslmode=disable, and TLS files are given (sslrootcert, sslcert, sslkey or \
             --tls-*): give sslmode=require, verify-ca or verify-full, or no TLS files",
            parsed.shown
        ));
    }
    let tls = match sslmode {
        SslMode::Disable => None,
        mode => Some(tls::connector(
            tls::check_of(mode, files.ca.is_some()),
            &files,
        )?),
    };
    let password = match &parsed.password {
        Some(password) => Some((password.clone(), PasswordFrom::Url)),
        None => endpoints.default_password(PASSWORD_VARIABLE)?,
    };
    endpoints.warn_about_visible_passwords();
    let login = Login {
        user,
        dbname,
        application_name: parsed
            .application_name
            .clone()
            .unwrap_or_else(|| "locked-run".into()),
        sslmode,
        tls,
    };
    let timeout = parsed.connect_timeout.unwrap_or(endpoints.connect_timeout);
    Ok(Client::new(parsed, login, password, timeout))
}

/// The name of the user this runs as, libpq's default role.
fn os_user() -> String {
    let name = crate::backend::user_name();
    if name.parse::<u32>().is_ok() {
        // A uid with no entry in /etc/passwd: libpq would fail; USER is the next best guess.
        return std::env::var("USER").unwrap_or(name);
    }
    name
}
