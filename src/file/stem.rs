//! The stem of the host-local backend's files for a NAME (`STEM.lock`, `STEM.fence`): no NAME
//! reaches outside the directory or shares a file with another NAME.

use crate::name::LockName;

/// The stem of the host-local backend's files (`STEM.lock`, `STEM.fence`): no NAME reaches
/// outside the directory or shares a file with another NAME. `%`, `/` and a leading `.`
/// are percent-encoded (so `..` and hidden files are impossible, and the temporary
/// `.STEM.fence.tmp` never collides with a stem); a stem that would be longer than
/// [`MAX_STEM`] bytes keeps its first part and ends in `%~` and a SHA-256 of the whole NAME
/// (`%~` never comes out of the encoding, so a shortened stem cannot equal a plain one).
pub fn of(name: &LockName) -> String {
    let name = name.as_str();
    let mut stem = String::with_capacity(name.len());
    for (i, c) in name.char_indices() {
        match c {
            '%' => stem.push_str("%25"),
            '/' => stem.push_str("%2F"),
            '.' if i == 0 => stem.push_str("%2E"),
            c => stem.push(c),
        }
    }
    if stem.len() <= MAX_STEM {
        return stem;
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, name.as_bytes());
    let hex: String = digest.as_ref()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let mut cut = MAX_STEM - 2 - hex.len();
    // Not inside a character, nor inside a %XX triplet.
    while !stem.is_char_boundary(cut) || stem[..cut].ends_with('%') || {
        let before = &stem.as_bytes()[..cut];
        before.len() >= 2 && before[before.len() - 2] == b'%'
    } {
        cut -= 1;
    }
    format!("{}%~{hex}", &stem[..cut])
}

/// The longest file stem of the host-local backend, in bytes: with `.` and `.fence.tmp` it
/// stays well under the 255 bytes a file name may have.
pub const MAX_STEM: usize = 200;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_stems_stay_inside_the_directory_and_apart() {
        let stem = |n: &str| of(&LockName::new(n).unwrap());
        assert_eq!(stem("db.migrate-v2"), "db.migrate-v2");
        assert_eq!(stem("team/job"), "team%2Fjob");
        assert_eq!(stem(".."), "%2E.");
        assert_eq!(stem(".hidden"), "%2Ehidden");
        assert_eq!(stem("a.b"), "a.b");
        assert_eq!(stem("100%"), "100%25");
        // The encoding is injective: the encoded form of one name is another name.
        assert_ne!(stem("team%2Fjob"), stem("team/job"));
        assert_ne!(stem("%2E."), stem(".."));
        assert_eq!(stem(&"x".repeat(200)), "x".repeat(200));

        let long = "/".repeat(200);
        let short = stem(&long);
        assert!(short.len() <= MAX_STEM, "{}", short.len());
        assert!(short.contains("%~"), "{short}");
        assert!(!short.contains('/'));
        let mut other = "/".repeat(199);
        other.push('a');
        assert_ne!(
            stem(&other),
            short,
            "names with one prefix get different hashes"
        );
        let odd = format!("x{}", "/".repeat(199));
        let s = stem(&odd);
        assert!(s.len() <= MAX_STEM);
        let (head, _) = s.split_once("%~").unwrap();
        assert!(head.ends_with("%2F"), "cut on a triplet's boundary: {head}");
        let wide = "é/".repeat(66);
        assert!(stem(&wide).len() <= MAX_STEM);
    }
}
