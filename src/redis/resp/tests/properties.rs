//! Property tests of the protocol client: arbitrary bytes and RESP-like bytes never break the
//! parser (no panic, no allocation past the limits), commands round-trip, and the generators
//! of replies the oracle module also draws from.

use super::*;

/// What `parse` must uphold for any input: no panic (proptest reports one), a protocol
/// error or an answer that takes at least one byte and no more than it was given, the
/// same answer from exactly those bytes and "more please" from fewer, and an allocation
/// bounded by the input's length whatever it announces.
pub(super) fn check_parse(buf: &[u8]) -> Result<(), TestCaseError> {
    let (parsed, peak) = measure(|| parse(buf));
    prop_assert!(
        peak <= allocation_bound(buf.len()),
        "{peak} bytes allocated for {} bytes of input",
        buf.len()
    );
    match parsed {
        Err(e) => prop_assert_eq!(e.kind(), io::ErrorKind::InvalidData),
        Ok(None) => {}
        Ok(Some((reply, used))) => {
            prop_assert!(
                used > 0 && used <= buf.len(),
                "used {used} of {}",
                buf.len()
            );
            prop_assert_eq!(parse(&buf[..used]).ok(), Some(Some((reply, used))));
            for cut in cuts(used) {
                prop_assert_eq!(parse(&buf[..cut]).ok(), Some(None), "cut at {}", cut);
            }
        }
    }
    Ok(())
}

/// Numbers at the edges: of the integer types, and of this parser's limits.
pub(super) const NUMBERS: &[&str] = &[
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775808",
    "18446744073709551615",
    "4294967296",
    "16777216",
    "16777203",
    "16777204",
    "1000000",
    "1000001",
    "500000",
    "500001",
    "-0",
    "+1",
];

/// Where to cut `len` bytes to check that a prefix asks for more: everywhere when they are
/// few, else some 500 places and the last byte, so that long inputs stay cheap.
pub(super) fn cuts(len: usize) -> impl Iterator<Item = usize> {
    let step = (len / 500).max(1);
    (0..len).step_by(step).chain(len.checked_sub(1))
}

/// Pieces of RESP, and of things that look like it, to concatenate: uniform bytes seldom
/// get past the type byte, these reach every branch and every limit.
pub(super) fn token() -> impl Strategy<Value = Vec<u8>> {
    let select = |items: &[&'static str]| {
        prop::sample::select(items.to_vec()).prop_map(|s| s.as_bytes().to_vec())
    };
    prop_oneof![
        4 => prop::sample::select(b"+-:$*%~>|_#,(!=".to_vec()).prop_map(|b| vec![b]),
        4 => Just(b"\r\n".to_vec()),
        1 => select(&["\r", "\n", "t", "f", "txt:", " "]),
        4 => (-3i64..40).prop_map(|n| n.to_string().into_bytes()),
        2 => prop::sample::select(NUMBERS).prop_map(|n| n.as_bytes().to_vec()),
        // Whole headers announcing sizes at (and past) the limits.
        2 => (prop::sample::select(b"$=!*%~>|".to_vec()), prop::sample::select(NUMBERS))
            .prop_map(|(kind, n)| format!("{}{n}\r\n", kind as char).into_bytes()),
        3 => select(&[
            ":1\r\n",
            "+OK\r\n",
            "-ERR x\r\n",
            "$3\r\nabc\r\n",
            "$0\r\n\r\n",
            "$-1\r\n",
            "*0\r\n",
            "*-1\r\n",
            "_\r\n",
            "#t\r\n",
            ",1.5\r\n",
            "=7\r\ntxt:abc\r\n",
            "!5\r\nERR x\r\n",
            "|1\r\n+a\r\n:1\r\n",
            ">1\r\n+m\r\n",
        ]),
        // Runs of headers, to nest past the depth limit (and, without it, past the stack).
        1 => (1usize..1200).prop_map(|n| b"*1\r\n".repeat(n)),
        1 => (1usize..1200).prop_map(|n| b"|0\r\n".repeat(n)),
        2 => vec(any::<u8>(), 0..8),
    ]
}

pub(super) fn resp_like() -> impl Strategy<Value = Vec<u8>> {
    vec(token(), 0..48).prop_map(|tokens| tokens.concat())
}

/// Bytes with the protocol's own delimiters in them more often than chance would have.
pub(super) fn bytes(len: std::ops::Range<usize>) -> impl Strategy<Value = Vec<u8>> {
    vec(
        prop_oneof![4 => any::<u8>(), 1 => Just(b'\r'), 1 => Just(b'\n')],
        len,
    )
}

/// The text of a status or error line: anything but the CRLF that ends it.
pub(super) fn line() -> impl Strategy<Value = String> {
    vec(
        prop_oneof![4 => any::<char>(), 1 => Just('\r'), 1 => Just('\n')],
        0..16,
    )
    .prop_map(String::from_iter)
    .prop_filter("a line holds no CRLF", |s| !s.contains("\r\n"))
}

/// Replies of the kinds the parser gives back as they were sent (not folded).
pub(super) fn reply_tree() -> impl Strategy<Value = Reply> {
    let leaf = prop_oneof![
        line().prop_map(Reply::Status),
        line().prop_map(Reply::Error),
        any::<i64>().prop_map(Reply::Int),
        Just(Reply::Bulk(None)),
        bytes(0..32).prop_map(|b| Reply::Bulk(Some(b))),
    ];
    leaf.prop_recursive(5, 64, 6, |inner| {
        prop_oneof![
            Just(Reply::Array(None)),
            vec(inner.clone(), 0..6).prop_map(|items| Reply::Array(Some(items))),
            vec(inner, 0..6).prop_map(Reply::Push),
        ]
    })
}

/// Writes `reply` as a server would: in RESP2, or in RESP3 with its own types (blob errors,
/// null, verbatim strings, maps and sets, which fold back into arrays) and an attribute
/// before each array, which the parser skips.
pub(super) fn write_reply(out: &mut Vec<u8>, reply: &Reply, resp3: bool) {
    let mut put = |parts: &[&[u8]]| parts.iter().for_each(|p| out.extend_from_slice(p));
    match reply {
        Reply::Status(s) => put(&[b"+", s.as_bytes(), b"\r\n"]),
        Reply::Error(e) if resp3 => put(&[
            format!("!{}\r\n", e.len()).as_bytes(),
            e.as_bytes(),
            b"\r\n",
        ]),
        Reply::Error(e) => put(&[b"-", e.as_bytes(), b"\r\n"]),
        Reply::Int(i) => put(&[format!(":{i}\r\n").as_bytes()]),
        Reply::Bulk(None) if resp3 => put(&[b"_\r\n"]),
        Reply::Bulk(None) => put(&[b"$-1\r\n"]),
        Reply::Bulk(Some(b)) if resp3 => {
            put(&[format!("={}\r\ntxt:", b.len() + 4).as_bytes(), b, b"\r\n"])
        }
        Reply::Bulk(Some(b)) => put(&[format!("${}\r\n", b.len()).as_bytes(), b, b"\r\n"]),
        Reply::Array(None) => put(&[b"*-1\r\n"]),
        Reply::Array(Some(items)) => {
            let header = match (resp3, items.len()) {
                (false, n) => format!("*{n}\r\n"),
                (true, n) if n % 2 == 0 => format!("|1\r\n+ttl\r\n:3\r\n%{}\r\n", n / 2),
                (true, n) => format!("|1\r\n+ttl\r\n:3\r\n~{n}\r\n"),
            };
            put(&[header.as_bytes()]);
            items.iter().for_each(|item| write_reply(out, item, resp3));
        }
        Reply::Push(items) => {
            put(&[format!(">{}\r\n", items.len()).as_bytes()]);
            items.iter().for_each(|item| write_reply(out, item, resp3));
        }
    }
}

pub(super) fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        // A failure prints its smallest input; the bug it shows is then pinned by a named
        // unit test, not by a regressions file written beside the source.
        failure_persistence: None,
        max_shrink_time: 20_000,
        ..ProptestConfig::default()
    }
}

// The case counts keep the module's tests to a few seconds in a debug build, in CI's plain
// `cargo test` too; each run draws new cases.
proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn arbitrary_bytes_never_break_the_parser(buf in vec(any::<u8>(), 0..4096)) {
        check_parse(&buf)?;
    }
}

proptest! {
    #![proptest_config(config(1024))]

    #[test]
    fn resp_like_bytes_never_break_the_parser(buf in resp_like()) {
        check_parse(&buf)?;
    }
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn commands_round_trip(args in vec(prop_oneof![8 => bytes(0..64), 1 => bytes(0..1024)], 0..12)) {
        let args: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
        let mut out = Vec::new();
        encode(&mut out, &args);
        let bulks = args.iter().map(|a| Reply::Bulk(Some(a.to_vec()))).collect();
        prop_assert_eq!(parse(&out).ok(), Some(Some((Reply::Array(Some(bulks)), out.len()))));
        for cut in cuts(out.len()) {
            prop_assert_eq!(parse(&out[..cut]).ok(), Some(None), "cut at {}", cut);
        }
    }

}

proptest! {
    #![proptest_config(config(1024))]

    #[test]
    fn replies_round_trip(
        reply in reply_tree(),
        resp3 in any::<bool>(),
        sizes in vec(1usize..64, 1..6),
    ) {
        let mut out = Vec::new();
        write_reply(&mut out, &reply, resp3);
        prop_assert_eq!(parse(&out).ok(), Some(Some((reply.clone(), out.len()))));
        for cut in cuts(out.len()) {
            prop_assert_eq!(parse(&out[..cut]).ok(), Some(None), "cut at {}", cut);
        }
        // Through a connection, in reads of any size, two replies in a row: what one
        // read brings of the next reply is kept for it.
        let mut conn = connection([&out[..], &out[..]].concat(), sizes, None);
        prop_assert_eq!(read_now(&mut conn).ok(), Some(reply.clone()));
        prop_assert_eq!(read_now(&mut conn).ok(), Some(reply));
        prop_assert!(conn.buf.is_empty());
    }
}
