//! The NAMEs etcd's lock takes beyond every backend's rules (`crate::name`), checked in one
//! place for the command line, `doctor` and the library alike.

use crate::name::LockName;

/// A NAME with no `/`: etcd's recipe keeps a NAME's contenders under `NAME/`, so lock `p` would
/// see lock `p/job`'s keys as its own contenders, and `release --force p` would free them.
///
/// And not `locked-run`, under whose prefix the NAMEs' histories are kept (`history.rs`): that
/// lock would count them as its contenders.
pub fn check(name: &LockName) -> Result<(), String> {
    if name.as_str() == super::history::ROOT {
        return Err(crate::text::message!(
            "the lock name {name} is kept for locked-run's own use on etcd:// (the history of \
             every NAME lives under {name}/); choose another"
        ));
    }
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
        assert!(check(&LockName::new("locked-run").unwrap()).is_err());
    }
}
