//! The NAMEs etcd's lock takes beyond every backend's rules (`crate::name`), checked in one
//! place for the command line, `doctor` and the library alike.

use crate::name::LockName;

/// A NAME with no `/`: etcd's recipe keeps a NAME's contenders under `NAME/`, so lock `p` would
/// see lock `p/job`'s keys as its own contenders, and `release --force p` would free them.
pub fn check(name: &LockName) -> Result<(), String> {
    match name.as_str().contains('/') {
        false => Ok(()),
        true => Err(crate::text::message!(
            "lock names on etcd:// hold no '/' ({name} has one): etcd's lock keeps a NAME's \
             keys under NAME/, where another NAME's would mix with them; use '-' or '.'"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // See: issue 35, item 5: the line showed `(LockName("team/migrate"))`.
    #[test]
    fn the_line_shows_the_name_as_given() {
        let name = LockName::new("team/migrate").unwrap();
        let line = check(&name).unwrap_err();
        assert!(line.contains("(team/migrate has one)"), "{line}");
        assert!(!line.contains("LockName"), "{line}");
        assert_eq!(check(&LockName::new("team-migrate").unwrap()), Ok(()));
    }
}
