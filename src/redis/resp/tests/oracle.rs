//! The `redis` crate's parser as an oracle: replies of every RESP2 and RESP3 type, read by a
//! connection in pieces of any size, byte by byte too, must be what the crate reads from them,
//! once the crate's values are folded as this client folds them.
//!
//! Where the two legitimately differ, the generator keeps off:
//! - Text that is not UTF-8 in a simple string or error, a verbatim string, a push's kind or
//!   a big number: the crate refuses it (or decodes it lossily), this client decodes it
//!   lossily. Bulk strings and blob errors carry any bytes.
//! - Doubles: the crate keeps a float, this client the text; only texts a float prints back
//!   as themselves compare (Rust's own printing of any float but NaN), so not a server's
//!   `nan` or `1e+300`.
//! - Negative counts but `*-1` (and `$-1`): the crate reads `~-1` as nil, `>-1` and `>0` as a
//!   push of kind "" and refuses `%-1`; this client reads each as the nil array. No server
//!   sends them.
//! - A push must start with its kind, a string, or the crate refuses it; a verbatim string's
//!   format is three letters (the crate splits at the first `:`, this client drops four
//!   bytes), integers are written without spaces (the crate trims them), and replies nest
//!   a few deep (the crate refuses past 100, this client past 64).

use proptest::collection::vec;
use proptest::prelude::*;
use redis::Value;

use super::*;

/// A reply as a server writes it.
#[derive(Clone, Debug)]
enum Wire {
    Simple(String),
    Error(String),
    BlobError(String),
    Int(i64),
    Bulk(Vec<u8>),
    NilBulk,
    NilArray,
    Null,
    Double(f64),
    Boolean(bool),
    Verbatim(&'static str, String),
    BigNumber(String),
    Array(Vec<Wire>),
    Set(Vec<Wire>),
    Map(Vec<(Wire, Wire)>),
    Push(String, Vec<Wire>),
    Attribute(Vec<(Wire, Wire)>, Box<Wire>),
}

fn write_wire(out: &mut Vec<u8>, wire: &Wire) {
    fn string(out: &mut Vec<u8>, kind: char, data: &[u8]) {
        out.extend_from_slice(format!("{kind}{}\r\n", data.len()).as_bytes());
        out.extend_from_slice(data);
        out.extend_from_slice(b"\r\n");
    }
    fn line(out: &mut Vec<u8>, kind: char, text: &str) {
        out.extend_from_slice(format!("{kind}{text}\r\n").as_bytes());
    }
    match wire {
        Wire::Simple(s) => line(out, '+', s),
        Wire::Error(e) => line(out, '-', e),
        Wire::BlobError(e) => string(out, '!', e.as_bytes()),
        Wire::Int(i) => line(out, ':', &i.to_string()),
        Wire::Bulk(b) => string(out, '$', b),
        Wire::NilBulk => line(out, '$', "-1"),
        Wire::NilArray => line(out, '*', "-1"),
        Wire::Null => line(out, '_', ""),
        Wire::Double(f) => line(out, ',', &f.to_string()),
        Wire::Boolean(b) => line(out, '#', if *b { "t" } else { "f" }),
        Wire::Verbatim(format, text) => string(out, '=', format!("{format}:{text}").as_bytes()),
        Wire::BigNumber(n) => line(out, '(', n),
        Wire::Array(items) | Wire::Set(items) => {
            let kind = if matches!(wire, Wire::Set(_)) {
                '~'
            } else {
                '*'
            };
            line(out, kind, &items.len().to_string());
            items.iter().for_each(|item| write_wire(out, item));
        }
        Wire::Push(kind, items) => {
            line(out, '>', &(items.len() + 1).to_string());
            string(out, '$', kind.as_bytes());
            items.iter().for_each(|item| write_wire(out, item));
        }
        Wire::Map(pairs) | Wire::Attribute(pairs, _) => {
            let kind = if matches!(wire, Wire::Map(_)) {
                '%'
            } else {
                '|'
            };
            line(out, kind, &pairs.len().to_string());
            for (key, value) in pairs {
                write_wire(out, key);
                write_wire(out, value);
            }
            if let Wire::Attribute(_, described) = wire {
                write_wire(out, described);
            }
        }
    }
}

fn text() -> impl Strategy<Value = String> {
    vec(any::<char>(), 0..12).prop_map(String::from_iter)
}

/// Replies of RESP2's types only, or of RESP3's too.
fn wire(resp3: bool) -> BoxedStrategy<Wire> {
    let resp2 = prop_oneof![
        line().prop_map(Wire::Simple),
        line().prop_map(Wire::Error),
        any::<i64>().prop_map(Wire::Int),
        bytes(0..32).prop_map(Wire::Bulk),
        Just(Wire::NilBulk),
        Just(Wire::NilArray),
    ];
    let leaf = if resp3 {
        prop_oneof![
            6 => resp2,
            1 => text().prop_map(Wire::BlobError),
            1 => Just(Wire::Null),
            1 => any::<f64>().prop_filter("NaN prints as no server writes it", |f| !f.is_nan())
                .prop_map(Wire::Double),
            1 => any::<bool>().prop_map(Wire::Boolean),
            1 => (prop::sample::select(vec!["txt", "mkd"]), text())
                .prop_map(|(format, text)| Wire::Verbatim(format, text)),
            1 => "-?[0-9]{1,40}".prop_map(Wire::BigNumber),
        ]
        .boxed()
    } else {
        resp2.boxed()
    };
    leaf.prop_recursive(4, 48, 5, move |inner| {
        let array = vec(inner.clone(), 0..5).prop_map(Wire::Array);
        if !resp3 {
            return array.boxed();
        }
        let pairs = || vec((inner.clone(), inner.clone()), 0..3);
        let kind = prop_oneof![
            prop::sample::select(vec!["message", "smessage", "subscribe", "invalidate"])
                .prop_map(str::to_owned),
            "[a-z]{0,8}",
        ];
        prop_oneof![
            2 => array,
            1 => vec(inner.clone(), 0..5).prop_map(Wire::Set),
            1 => pairs().prop_map(Wire::Map),
            1 => (kind, vec(inner.clone(), 0..4)).prop_map(|(kind, items)| Wire::Push(kind, items)),
            1 => (pairs(), inner.clone())
                .prop_map(|(pairs, described)| Wire::Attribute(pairs, Box::new(described))),
        ]
        .boxed()
    })
    .boxed()
}

/// The crate's value as this client folds it (see [`Reply`]): one nil, maps and sets as
/// flat arrays, booleans as integers, doubles, big numbers and verbatim strings as their
/// text, attributes gone, a push's kind back as its first element, an error's code and
/// detail back as one line.
fn folded(value: Value) -> Reply {
    let all = |items: Vec<Value>| items.into_iter().map(folded).collect();
    match value {
        Value::Nil => Reply::Bulk(None),
        Value::Int(i) => Reply::Int(i),
        Value::BulkString(b) => Reply::Bulk(Some(b)),
        Value::Array(items) | Value::Set(items) => Reply::Array(Some(all(items))),
        Value::SimpleString(s) => Reply::Status(s),
        Value::Okay => Reply::Status("OK".into()),
        Value::Map(pairs) => Reply::Array(Some(
            pairs
                .into_iter()
                .flat_map(|(key, value)| [folded(key), folded(value)])
                .collect(),
        )),
        Value::Attribute { data, .. } => folded(*data),
        Value::Double(f) => Reply::Bulk(Some(f.to_string().into_bytes())),
        Value::Boolean(b) => Reply::Int(b as i64),
        Value::VerbatimString { text, .. } => Reply::Bulk(Some(text.into_bytes())),
        Value::BigNumber(digits) => Reply::Bulk(Some(digits)),
        Value::Push { kind, data } => Reply::Push(
            [Reply::Bulk(Some(kind.to_string().into_bytes()))]
                .into_iter()
                .chain(data.into_iter().map(folded))
                .collect(),
        ),
        Value::ServerError(e) => Reply::Error(match e.details() {
            Some(detail) => format!("{} {detail}", e.code()),
            None => e.code().to_owned(),
        }),
        other => panic!("a value the generator does not make: {other:?}"),
    }
}

/// This client's reply without the one distinction the crate does not make: nil strings and
/// nil arrays are one nil there.
fn one_nil(reply: Reply) -> Reply {
    match reply {
        Reply::Array(None) => Reply::Bulk(None),
        Reply::Array(Some(items)) => Reply::Array(Some(items.into_iter().map(one_nil).collect())),
        Reply::Push(items) => Reply::Push(items.into_iter().map(one_nil).collect()),
        other => other,
    }
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn replies_read_as_the_redis_crate_reads_them(
        wire in any::<bool>().prop_flat_map(wire),
        sizes in vec(1usize..64, 1..6),
    ) {
        let mut out = Vec::new();
        write_wire(&mut out, &wire);
        let theirs = folded(redis::parse_redis_value(&out).expect("the crate reads it"));
        let ours = parse(&out).ok().flatten();
        prop_assert_eq!(ours.map(|(reply, used)| (one_nil(reply), used)), Some((theirs.clone(), out.len())));
        // Two in a row, so that where the first ends is checked too.
        for sizes in [sizes, vec![1]] {
            let mut conn = connection([&out[..], &out[..]].concat(), sizes, None);
            for _ in 0..2 {
                prop_assert_eq!(read_now(&mut conn).ok().map(one_nil), Some(theirs.clone()));
            }
            prop_assert!(conn.buf.is_empty());
        }
    }
}
