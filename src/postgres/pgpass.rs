//! The password for a PostgreSQL URL that carries none, where libpq looks for it: the URL,
//! `--password-file`, `PGPASSWORD`, then `~/.pgpass` (or the file `PGPASSFILE` names), whose
//! lines are `host:port:database:user:password` with `*` for any and `\:` for a colon. As libpq
//! does, a password file that its group or others may read is ignored, with a warning.

use std::os::unix::fs::MetadataExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use crate::endpoints::PasswordFrom;

/// The password file: `PGPASSFILE`, else `~/.pgpass`; and the words that name it.
pub fn file() -> Option<(PathBuf, &'static str)> {
    if let Some(path) = std::env::var_os("PGPASSFILE").filter(|p| !p.is_empty()) {
        return Some((PathBuf::from(path), "PGPASSFILE"));
    }
    let home = std::env::var_os("HOME").filter(|h| !h.is_empty())?;
    Some((PathBuf::from(home).join(".pgpass"), "~/.pgpass"))
}

/// The password the file gives for `host`, `port`, `database` and `user`: its first matching
/// line, as libpq reads it.
pub fn lookup(host: &str, port: u16, database: &str, user: &str) -> Option<(String, PasswordFrom)> {
    let (path, option) = file()?;
    // Opened without blocking (a FIFO would wait for a writer, beyond any signal), then
    // judged by what was opened.
    let mut opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&path)
        .ok()?;
    let meta = opened.metadata().ok()?;
    if !meta.is_file() {
        // libpq reads a regular file only: a FIFO would block the run, beyond any signal.
        tracing::warn!(
            "the password file {} is not a regular file: it is ignored, as libpq ignores it",
            path.display()
        );
        return None;
    }
    if meta.mode() & 0o077 != 0 {
        tracing::warn!(
            "the password file {} may be read by its group or others: it is ignored, as libpq \
             ignores it (chmod 0600 it)",
            path.display()
        );
        return None;
    }
    let mut text = String::new();
    std::io::Read::read_to_string(&mut opened, &mut text).ok()?;
    let port = port.to_string();
    let wanted = [host, port.as_str(), database, user];
    text.lines().find_map(|line| {
        let fields = fields(line)?;
        let matches = fields[..4]
            .iter()
            .zip(wanted)
            .all(|(field, want)| field == "*" || field == want);
        matches.then(|| {
            let from = PasswordFrom::File {
                option,
                path: path.clone(),
            };
            (fields[4].clone(), from)
        })
    })
}

/// A line's five fields, unescaped (`\:` and `\\`); `None` for a comment or a short line.
fn fields(line: &str) -> Option<Vec<String>> {
    if line.starts_with('#') || line.trim().is_empty() {
        return None;
    }
    let mut fields = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => fields.last_mut()?.extend(chars.next()),
            ':' if fields.len() < 5 => fields.push(String::new()),
            c => fields.last_mut()?.push(c),
        }
    }
    (fields.len() == 5).then_some(fields)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_is_five_fields_with_escapes() {
        assert_eq!(
            fields(r"db\:1:5432:*:app:pa\:ss:word").unwrap(),
            ["db:1", "5432", "*", "app", "pa:ss:word"]
        );
        assert!(fields("# comment").is_none());
        assert!(fields("h:1:d").is_none());
    }
}
