//! `doctor`'s check that cron finds this binary. cron runs a job with `PATH=/usr/bin:/bin`
//! unless the crontab sets another, so a `locked-run` installed elsewhere (`~/.cargo/bin`,
//! `/usr/local/bin`) makes every crontab line that names it fail with 127, and mail, every time.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use super::{Check, Level};

/// The PATH cron gives its jobs when the crontab sets none (Debian's cron and cronie alike).
const CRON_PATH: &str = "/usr/bin:/bin";

/// The running binary against cron's PATH: whatever the backend, `doctor` is run on a host
/// where the jobs will run.
pub(crate) fn check() -> Check {
    judge(std::env::current_exe().ok().as_deref(), CRON_PATH)
}

/// The check of the binary at `exe` against the directories of `path`, in order: the first
/// `locked-run` there is the one a crontab line runs.
fn judge(exe: Option<&Path>, path: &str) -> Check {
    let check = |level, detail| Check {
        server: "this host".to_owned(),
        check: "cron PATH",
        level,
        detail,
    };
    let Some(exe) = exe else {
        return check(
            Level::Warn,
            format!("cannot tell where this binary is, nor whether cron's PATH ({path}) finds it"),
        );
    };
    let found = path
        .split(':')
        .map(|dir| Path::new(dir).join("locked-run"))
        .find(|candidate| candidate.is_file());
    let dir = exe.parent().unwrap_or(Path::new("/"));
    let fix = format!(
        "write its full path ({}) in crontab lines, or set PATH={}:{path} at the top of the \
         crontab",
        exe.display(),
        dir.display()
    );
    match found {
        Some(found) if same_file(&found, exe) => check(
            Level::Ok,
            format!(
                "cron's default PATH ({path}) finds this binary as {}",
                found.display()
            ),
        ),
        Some(found) => check(
            Level::Warn,
            crate::text::message!(
                "cron's default PATH finds another locked-run ({}), not this one ({}): crontab lines \
                 that name it run that one; {fix}",
                found.display(),
                exe.display(),
            ),
        ),
        None => check(
            Level::Warn,
            crate::text::message!(
                "cron's default PATH does not find this locked-run ({path} has no locked-run): a \
                 crontab line that names it fails with status 127 (locked-run: not found); {fix}"
            ),
        ),
    }
}

/// Whether two paths name one file (a link to it, or /bin/x where /bin is /usr/bin).
fn same_file(a: &Path, b: &Path) -> bool {
    match (a.metadata(), b.metadata()) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// A directory standing in for cron's PATH, and a binary outside it.
    fn host() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let root = tempfile::tempdir().unwrap();
        let on_path = root.path().join("usr-bin");
        let elsewhere = root.path().join("local-bin");
        std::fs::create_dir_all(&on_path).unwrap();
        std::fs::create_dir_all(&elsewhere).unwrap();
        let exe = elsewhere.join("locked-run");
        std::fs::write(&exe, "").unwrap();
        (root, on_path, exe)
    }

    #[test]
    fn a_binary_cron_finds_is_ok() {
        let (_root, on_path, exe) = host();
        std::os::unix::fs::symlink(&exe, on_path.join("locked-run")).unwrap();
        let path = format!("/nonexistent:{}", on_path.display());
        let c = judge(Some(&exe), &path);
        assert_eq!(c.level, Level::Ok, "{}", c.detail);
        assert!(c.detail.contains("finds this binary"), "{}", c.detail);
    }

    #[test]
    fn a_binary_cron_does_not_find_is_a_warning_that_says_what_to_write() {
        let (_root, on_path, exe) = host();
        let c = judge(Some(&exe), &on_path.display().to_string());
        assert_eq!(c.level, Level::Warn);
        assert!(
            c.detail
                .starts_with("cron's default PATH does not find this locked-run"),
            "{}",
            c.detail
        );
        let dir = exe.parent().unwrap().display().to_string();
        assert!(c.detail.contains(&format!("PATH={dir}:")), "{}", c.detail);
        assert!(c.detail.contains("status 127"), "{}", c.detail);
    }

    #[test]
    fn another_binary_first_on_crons_path_is_a_warning_naming_both() {
        let (_root, on_path, exe) = host();
        let other = on_path.join("locked-run");
        std::fs::write(&other, "an older one").unwrap();
        let c = judge(Some(&exe), &on_path.display().to_string());
        assert_eq!(c.level, Level::Warn);
        assert!(
            c.detail
                .starts_with("cron's default PATH finds another locked-run"),
            "{}",
            c.detail
        );
        assert!(
            c.detail.contains(&other.display().to_string()),
            "{}",
            c.detail
        );
    }
}
