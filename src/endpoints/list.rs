//! Lists of URLs as `LOCKED_RUN_URL` holds them, and words of a shell command line (the
//! command a message tells the user to paste).

/// `word` as one word of a shell command line: as it is when it holds nothing a shell reads
/// specially, else in single quotes.
pub fn shell_word(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_@%+=:,./-".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}

/// Splits `LOCKED_RUN_URL`: whitespace separates, and so does a comma directly followed by
/// `scheme://` (a comma elsewhere may belong to a password or a path). A piece that starts
/// with no scheme means the split went wrong (a password holding a space): an error that
/// shows no piece, since any of them may hold part of a password.
pub fn split_checked(value: &str) -> Result<Vec<String>, String> {
    let urls = split(value);
    if urls.iter().any(|u| !starts_with_scheme(u)) {
        return Err(
            "LOCKED_RUN_URL holds a piece that is not a URL (not shown: it may be part of a \
             password); URLs are separated by whitespace, so a space in a password is written \
             %20"
            .into(),
        );
    }
    Ok(urls)
}

/// [`split_checked`] without the check.
pub fn split(value: &str) -> Vec<String> {
    let mut urls = Vec::new();
    for word in value.split_whitespace() {
        let mut start = 0;
        for (i, _) in word.match_indices(',') {
            if starts_with_scheme(&word[i + 1..]) {
                urls.push(&word[start..i]);
                start = i + 1;
            }
        }
        urls.push(&word[start..]);
    }
    urls.into_iter()
        .filter(|u| !u.is_empty())
        .map(str::to_owned)
        .collect()
}

fn starts_with_scheme(s: &str) -> bool {
    let Some((scheme, _)) = s.split_once("://") else {
        return false;
    };
    let mut chars = scheme.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_list_splits_on_whitespace_and_scheme_commas() {
        assert_eq!(
            split("redis://a:1 redis://b:2"),
            ["redis://a:1", "redis://b:2"]
        );
        assert_eq!(
            split("redis://a:1,redis://b:2"),
            ["redis://a:1", "redis://b:2"]
        );
        assert_eq!(split("redis://:pa,ss@a:1"), ["redis://:pa,ss@a:1"]);
        assert_eq!(split("  redis://a  "), ["redis://a"]);
    }
}
