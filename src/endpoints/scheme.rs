//! What a URL names, told by its scheme alone, and the URL as it may be printed: without its
//! password, wherever it is written (the user part, a `pass`/`password` parameter). Each
//! backend parses its own URLs in full; this is what the door needs before any of them does.

/// The kind of store a URL names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    /// A Redis server, or a topology of them: `redis://`, `rediss://`, `redis+unix://`,
    /// `redis+sentinel://`, `redis+cluster://` and their TLS forms. A scheme no store has is
    /// taken as Redis's too, whose parser names the schemes it knows.
    Redis { tls: bool, sentinel: bool },
    /// An etcd cluster: `etcd://`, `etcds://`.
    Etcd { tls: bool },
    /// A directory of this host: `file://`.
    File,
    /// A PostgreSQL database: `postgres://`, `postgresql://`.
    Postgres,
}

impl Scheme {
    pub fn of(url: &str) -> Scheme {
        let scheme = url
            .split_once("://")
            .map_or("", |(scheme, _)| scheme)
            .to_ascii_lowercase();
        match scheme.as_str() {
            "etcd" => Scheme::Etcd { tls: false },
            "etcds" => Scheme::Etcd { tls: true },
            "file" => Scheme::File,
            "postgres" | "postgresql" => Scheme::Postgres,
            _ if url
                .get(..5)
                .is_some_and(|s| s.eq_ignore_ascii_case("file:")) =>
            {
                Scheme::File
            }
            other => Scheme::Redis {
                tls: matches!(other, "rediss" | "rediss+sentinel" | "rediss+cluster"),
                sentinel: other.ends_with("+sentinel"),
            },
        }
    }

    /// Whether the URL asks for TLS by its scheme (a PostgreSQL URL says so with `sslmode`).
    pub fn tls(self) -> bool {
        match self {
            Scheme::Redis { tls, .. } | Scheme::Etcd { tls } => tls,
            Scheme::File | Scheme::Postgres => false,
        }
    }
}

/// The schemes URLs are written with, as they come before `://`.
const SCHEMES: [&str; 12] = [
    "redis",
    "rediss",
    "redis+unix",
    "redis+sentinel",
    "rediss+sentinel",
    "redis+cluster",
    "rediss+cluster",
    "etcd",
    "etcds",
    "postgres",
    "postgresql",
    "file",
];

/// The line for a URL whose scheme is one of ours but whose `//` is missing or short
/// (`redis:/127.0.0.1`, `postgres:db1/locks`): read as it is, it would be a URL with no host,
/// or no URL at all, and the line would say so without saying why. `None` for any other URL,
/// and for `file:/DIR`, which names the directory as `file:///DIR` does.
pub fn missing_slashes(url: &str) -> Option<String> {
    if url.contains("://") {
        return None;
    }
    let (scheme, rest) = url.split_once(':')?;
    let lower = scheme.to_ascii_lowercase();
    if !SCHEMES.contains(&lower.as_str()) || lower == "file" {
        return None;
    }
    let slashes = &rest[..rest.len() - rest.trim_start_matches('/').len()];
    let rest = rest.trim_start_matches('/');
    // `redis:6379` is a host named redis and its port, not a URL short of its `//`.
    let first = rest.split(['/', '?']).next().unwrap_or_default();
    if slashes.is_empty() && !first.is_empty() && first.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // A socket's path keeps its own leading `/` after the empty host.
    let root = if lower == "redis+unix" { "/" } else { "" };
    let fixed = printable(&format!("{scheme}://{root}{rest}"));
    let written = fixed.replacen("://", &format!(":{slashes}"), 1);
    let written = written.replacen(
        &format!(":{slashes}/"),
        &format!(":{slashes}"),
        (root == "/") as usize,
    );
    Some(crate::text::message!(
        "{written} has no // after {scheme}: write {fixed}"
    ))
}

/// `url` as it may be printed: its password taken out of the user part and of the query
/// (`pass`, `password`). A URL of one host is read as a URL; one that lists several hosts
/// (sentinels, a Cluster's seeds, etcd's members, PostgreSQL's hosts) is cut by hand, its user
/// part ending at the last `@` (a password may hold a `/`, and must never be taken for the path).
pub fn printable(url: &str) -> String {
    // The url crate ends the user part at a `?` or `#`: a password holding one would be
    // read as a host, a port and a query, and printed.
    let plain = url.split_once("://").is_some_and(|(_, rest)| {
        let (auth, hosts, _) = authority(rest);
        !hosts.contains(',') && !auth.is_some_and(|a| a.contains(['?', '#']))
    });
    if plain {
        if let Ok(parsed) = ::url::Url::parse(url) {
            return redact(&parsed);
        }
    }
    let Some((scheme, rest)) = url.split_once("://") else {
        return format!("{url:?}");
    };
    let (auth, hosts, tail) = authority(rest);
    let user = auth.map(|auth| auth.split_once(':').map_or(auth, |(user, _)| user));
    let tail = match tail.split_once('?') {
        Some((path, query)) => match without_passwords(query) {
            query if query.is_empty() => path.to_owned(),
            query => format!("{path}?{query}"),
        },
        None => tail.to_owned(),
    };
    match user.filter(|u| !u.is_empty()) {
        Some(user) => format!("{scheme}://{user}@{hosts}{tail}"),
        None => format!("{scheme}://{hosts}{tail}"),
    }
}

/// Whether `url` carries a password (in its user part or a `pass`/`password` parameter).
pub fn has_password(url: &str) -> bool {
    let Some((_, rest)) = url.split_once("://") else {
        return false;
    };
    let (auth, _, tail) = authority(rest);
    let in_user = auth.is_some_and(|a| a.split_once(':').is_some_and(|(_, p)| !p.is_empty()));
    let in_query = tail
        .split_once('?')
        .is_some_and(|(_, query)| query.split('&').any(|pair| secret(pair.split('=').next())));
    in_user || in_query
}

/// What follows `scheme://`, cut into the user part, the hosts, and the rest (path and query,
/// with their leading `/` or `?`). The user part ends at the last `@` before the first `/`
/// that follows an `@`: a password may hold a `/`, `?` or `#` that its writer did not encode
/// (libpq reads a `?` there as part of it too). A URL whose authority is empty
/// (`redis+unix:///run/redis.sock`) has none.
pub fn authority(rest: &str) -> (Option<&str>, &str, &str) {
    let end = match rest.find('@').filter(|_| !rest.starts_with('/')) {
        Some(first) => rest[first..].find('/').map_or(rest.len(), |i| first + i),
        None => 0,
    };
    let (auth, after) = match rest[..end].rfind('@') {
        Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
        None => (None, rest),
    };
    let hosts_end = after.find(['/', '?']).unwrap_or(after.len());
    (auth, &after[..hosts_end], &after[hosts_end..])
}

/// A query without its `pass`, `password` and `sslpassword` parameters (in any case: a
/// parameter a store refuses by name is still a secret its writer meant).
fn without_passwords(query: &str) -> String {
    query
        .split('&')
        .filter(|pair| !secret(pair.split('=').next()))
        .collect::<Vec<_>>()
        .join("&")
}

/// Whether a query parameter's name says it holds a secret.
fn secret(key: Option<&str>) -> bool {
    key.is_some_and(|key| {
        ["pass", "password", "sslpassword"]
            .iter()
            .any(|s| key.eq_ignore_ascii_case(s))
    })
}

/// A parsed URL with any password removed, so it can be printed.
pub fn redact(url: &::url::Url) -> String {
    let mut url = url.clone();
    if url.password().is_some() {
        let _ = url.set_password(None);
    }
    if url.query().is_some() {
        let pairs: Vec<(String, String)> = url
            .query_pairs()
            .filter(|(k, _)| !secret(Some(k)))
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        if pairs.is_empty() {
            url.set_query(None);
        } else {
            url.query_pairs_mut().clear().extend_pairs(pairs);
        }
    }
    url.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scheme_names_its_store() {
        let redis = |tls, sentinel| Scheme::Redis { tls, sentinel };
        for (url, scheme) in [
            ("redis://h", redis(false, false)),
            ("rediss://h", redis(true, false)),
            ("redis+unix:///run/redis.sock", redis(false, false)),
            ("redis+sentinel://h/m", redis(false, true)),
            ("rediss+sentinel://h/m", redis(true, true)),
            ("rediss+cluster://h", redis(true, false)),
            ("etcd://h", Scheme::Etcd { tls: false }),
            ("etcds://h", Scheme::Etcd { tls: true }),
            ("file:///var/lib/locks", Scheme::File),
            ("FILE:///x", Scheme::File),
            ("postgres://u@h/db", Scheme::Postgres),
            ("postgresql://h", Scheme::Postgres),
        ] {
            assert_eq!(Scheme::of(url), scheme, "{url}");
        }
    }

    /// See issue 47: `-u redis:/127.0.0.1` was answered "has no host", which does not say
    /// what is wrong with it.
    #[test]
    fn a_url_without_its_double_slash_is_told_so() {
        for (url, line) in [
            (
                "redis:/127.0.0.1",
                "redis:/127.0.0.1 has no // after redis: write redis://127.0.0.1",
            ),
            (
                "redis:127.0.0.1:6379/2",
                "redis:127.0.0.1:6379/2 has no // after redis: write redis://127.0.0.1:6379/2",
            ),
            (
                "postgres:/db1:5432/locks",
                "postgres:/db1:5432/locks has no // after postgres: write \
                 postgres://db1:5432/locks",
            ),
            (
                "redis+unix:/run/redis.sock",
                "redis+unix:/run/redis.sock has no // after redis+unix: write \
                 redis+unix:///run/redis.sock",
            ),
            (
                "etcds:/e1:2379,e2:2379",
                "etcds:/e1:2379,e2:2379 has no // after etcds: write etcds://e1:2379,e2:2379",
            ),
            // Never its password.
            (
                "redis:/app:pw@h:6379",
                "redis:/app@h:6379 has no // after redis: write redis://app@h:6379",
            ),
        ] {
            assert_eq!(missing_slashes(url).as_deref(), Some(line), "{url}");
        }
        for url in [
            "redis://127.0.0.1",
            "redis:///x",
            "file:/var/lib/locks",
            "http:/example.com",
            "127.0.0.1:6379",
            // A host named redis (a container's service) and its port.
            "redis:6379",
        ] {
            assert_eq!(missing_slashes(url), None, "{url}");
        }
    }

    #[test]
    fn no_password_is_ever_printed() {
        for (url, shown) in [
            ("redis://:pw@h:6379/2", "redis://h:6379/2"),
            (
                "redis://u:pw@h:6379?password=pw&x=1",
                "redis://u@h:6379?x=1",
            ),
            (
                "rediss+sentinel://u:p/w@s1:26379,s2:26379/m",
                "rediss+sentinel://u@s1:26379,s2:26379/m",
            ),
            ("etcd://u:pw@h:1,g:2", "etcd://u@h:1,g:2"),
            ("etcd://u:pw@h:2379", "etcd://u@h:2379"),
            (
                "postgres://app:pw@a:5432,b:5432/db?sslmode=require&password=pw",
                "postgres://app@a:5432,b:5432/db?sslmode=require",
            ),
            ("file:///var/lib/locks", "file:///var/lib/locks"),
            // A `?` in a password its writer did not encode (libpq takes it as the password's).
            ("postgres://u:p?w@h/db", "postgres://u@h/db"),
            ("postgres://u:12?pw@h/db", "postgres://u@h/db"),
            // A secret parameter whatever its case, also one the store refuses by name.
            (
                "postgres://u@h/db?sslmode=require&Password=pw",
                "postgres://u@h/db?sslmode=require",
            ),
            (
                "redis+unix:///run/r.sock?password=pw",
                "redis+unix:///run/r.sock",
            ),
        ] {
            assert_eq!(printable(url), shown, "{url}");
            assert!(!printable(url).contains("pw"), "{url}");
        }
        assert!(has_password("redis://:pw@h"));
        assert!(has_password("redis://h?password=pw"));
        assert!(has_password("postgres://a:pw@h1,h2/db"));
        assert!(!has_password("etcd://u@h"));
        assert!(!has_password("file:///x"));
    }
}
