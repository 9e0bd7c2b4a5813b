//! Replies read as they arrive, in pieces: the work stays linear in a reply's size, and a
//! reply that breaks a limit is refused as soon as its header is in, whatever came before.

use super::*;

/// `*N` of `n` bulk strings of `each` bytes.
fn array_of_strings(n: usize, each: usize) -> Vec<u8> {
    let mut bytes = format!("*{n}\r\n").into_bytes();
    for i in 0..n {
        bytes.extend_from_slice(format!("${each}\r\n").as_bytes());
        bytes.resize(bytes.len() + each, b'a' + (i % 26) as u8);
        bytes.extend_from_slice(b"\r\n");
    }
    bytes
}

// Once, after each read of at most 4 KiB, the reply was parsed again from its first
// byte, so a 4 MB array took 15 s to read. Counting the bytes the parser looks at checks
// the fix without a clock: before it, this reply's bytes were looked at some 500 times each.
#[test]
fn reading_a_big_reply_looks_at_each_byte_about_once() {
    let long_line = [&b"+"[..], &vec![b'x'; 4 << 20], b"\r\n"].concat();
    let mut integers = b"*100000\r\n".to_vec();
    integers.extend_from_slice(&b":7\r\n".repeat(100_000));
    let nested = [
        &b"*1\r\n*10000\r\n"[..],
        &b"%1\r\n$1\r\nk\r\n|1\r\n+a\r\n:1\r\n$30\r\nabcdefghijabcdefghijabcdefghij\r\n"
            .repeat(10_000),
    ]
    .concat();
    let cases = [
        (
            "an array of 50 000 bulk strings",
            array_of_strings(50_000, 64),
        ),
        (
            "one 4 MB bulk string",
            array_of_strings(1, 4 << 20)[4..].to_vec(),
        ),
        ("a 4 MB status line", long_line),
        ("an array of 100 000 integers", integers),
        ("nested maps with attributes", nested),
    ];
    for (what, bytes) in cases {
        let len = bytes.len();
        let mut conn = connection(bytes, vec![4096], None);
        let reply = read_now(&mut conn).unwrap();
        assert!(conn.buf.is_empty(), "{what}: the whole reply was taken");
        assert!(
            !matches!(reply, Reply::Error(_)),
            "{what}: read as {reply:?}"
        );
        // Counted by the connection's own parser: one made afresh for each read would
        // count nothing there.
        let examined = conn.parser.examined();
        assert!(
            examined > 0 && examined <= 4 * len,
            "{what}: {examined} bytes looked at to read {len}"
        );
    }
}

/// Reads `bytes` through a connection in reads of `sizes` bytes, the server sending `x`
/// without end after them: the error, once `bytes` have all been read and no more.
fn refused_piecewise(bytes: &[u8], sizes: Vec<usize>, what: &str) {
    let mut conn = connection(bytes.to_vec(), sizes.clone(), Some(b'x'));
    let err = read_now(&mut conn).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
    assert!(err.to_string().contains(what), "{err}");
    assert_eq!(
        conn.buf.len(),
        bytes.len(),
        "refused only after more than the header (reads of {sizes:?}): {err}"
    );
}

#[test]
fn limits_refuse_a_reply_as_soon_as_its_header_is_in() {
    let too_deep = [&b"*1\r\n".repeat(MAX_DEPTH)[..], b"|1\r\n"].concat();
    let small: [(&[u8], &str); 8] = [
        (b"$2000000000\r\n", "longer than the 16 MiB"),
        (b"*2\r\n$3\r\nabc\r\n=16777200\r\n", "longer than"),
        (b"*100001\r\n", "over the 100000 values"),
        (b"%50001\r\n", "over the 100000 values"),
        (
            b"*2\r\n|1\r\n+a\r\n+b\r\n*99998\r\n",
            "after 4 values, over the 100000 values",
        ),
        (&b"*1\r\n".repeat(MAX_DEPTH + 1), "nested more than 64 deep"),
        (&too_deep, "nested more than 64 deep"),
        (b"*2\r\n$3\r\nabc\r\n:x\r\n", "not a number"),
    ];
    for (bytes, what) in small {
        for sizes in [vec![1], vec![3, 5], vec![4096]] {
            refused_piecewise(bytes, sizes, what);
        }
    }

    // Headers that break a limit only with what came before them, megabytes of it.
    let mut values = b"*3\r\n*50000\r\n".to_vec();
    values.extend_from_slice(&b":1\r\n".repeat(50_000));
    values.extend_from_slice(b"*49998\r\n");
    let mut bytes = array_of_strings(2, 12 << 20);
    bytes.truncate(bytes.len() - (12 << 20) - 2);
    bytes.truncate(bytes.len() - format!("${}\r\n", 12 << 20).len());
    bytes.extend_from_slice(b"$5000000\r\n");
    for (bytes, what) in [(values, "over the 100000 values"), (bytes, "longer than")] {
        refused_piecewise(&bytes, vec![4096], what);
    }
}

/// A reply in pieces of every size, from one byte on, is the reply read at once: the parse
/// kept between reads, where a CRLF or a header is split, gets what a parse from scratch gets.
#[test]
fn a_reply_split_anywhere_reads_the_same() {
    let reply: &[u8] = b"*4\r\n|1\r\n+ttl\r\n:3\r\n%1\r\n$1\r\nk\r\n~2\r\n#t\r\n,1.5\r\n\
                        =7\r\ntxt:abc\r\n>2\r\n$7\r\nmessage\r\n+a\r\n+\nx\ry\r\r\n\r\n";
    let (whole, used) = parse(reply).unwrap().unwrap();
    assert_eq!(used, reply.len() - 2, "an empty line is not a reply's");
    let Reply::Array(Some(items)) = &whole else {
        panic!("{whole:?}");
    };
    assert_eq!(items[3], Reply::Status("\nx\ry\r".into()));
    for size in 1..reply.len() {
        let mut conn = connection(reply.to_vec(), vec![size], None);
        assert_eq!(read_now(&mut conn).unwrap(), whole, "reads of {size}");
        let err = read_now(&mut conn).unwrap_err();
        assert!(
            err.to_string().contains("empty line"),
            "reads of {size}: {err}"
        );
    }
}
