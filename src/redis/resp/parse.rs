//! Parsing replies as their bytes arrive: a scan of a reply's framing that resumes where the
//! previous read left it and refuses what breaks a limit as soon as a header says so, then
//! one pass that builds the value once the reply is complete.
//!
//! Parsing from the reply's first byte after every read of a few KiB, as this client once did,
//! walked everything buffered so far each time: a 4 MB array reply took 8 to 15 s. The scan
//! keeps its place between reads, so every byte is looked at about once, and the value is
//! built once.

use std::io;

use super::{Reply, limit_error, protocol_error};

// Limits on what one reply may announce. The parser trusts nothing it reads: without them a
// server (or whoever sits between it and us) announcing a 2 GB bulk string made the connection
// buffer 2 GB, and `*1\r\n` some hundreds of times over overflowed the stack. This client only
// ever reads small replies (scripts' results, INFO, CLUSTER SLOTS of a large cluster, HGETALL of
// a holder hash), far below each limit; the server's own proto-max-bulk-len (512 MiB) is no
// guide, as it bounds what a server accepts, not what a lock client needs to read.

/// The bytes one reply may take, attributes included: also the most a connection buffers.
pub(super) const MAX_REPLY_BYTES: usize = 16 << 20;
/// The values one reply may hold, counting every element of every aggregate in it (a map's
/// entries count twice, as they fold into a flat array): the parsed tree's arrays then take
/// at most some 6.4 MiB (32 bytes an element, twice that while a `Vec` grows by doubling),
/// and with each short string's own allocation the whole tree stays near 10 MiB; a million
/// eight-byte strings took the wrapper to 125 MB.
pub(super) const MAX_VALUES: usize = 100_000;
/// How deep aggregates may nest. Each level takes stack (a frame of `build`, a few KiB in a
/// debug build); real replies nest a handful deep (CLUSTER SHARDS, the deepest, four).
pub(super) const MAX_DEPTH: usize = 64;
/// The elements an aggregate gets room for before they are built; a larger one grows as they
/// come.
pub(super) const PREALLOCATED: usize = 1024;

/// The parse of the reply at the front of a connection's buffer, kept between reads.
pub(super) struct Parser {
    /// Where the next header starts, counted from the reply's first byte.
    at: usize,
    /// How many bytes from `at` on hold no line end: a long line arriving in pieces is
    /// searched once, not again from its start after each read.
    searched: usize,
    /// Once a string's header is read: where the string and its CRLF end. Its bytes are
    /// not looked at, only waited for.
    string_end: Option<usize>,
    /// The aggregates open around `at`, innermost last.
    open: Vec<Open>,
    /// What is left of the reply's `MAX_VALUES`.
    values: usize,
    /// The bytes the scan has looked at, over every reply: what the test that reading is
    /// linear counts.
    examined: usize,
}

struct Open {
    /// Its elements still to come (a map's entries count twice).
    left: usize,
    /// An attribute describes the value after it: once it ends that value is still to come,
    /// and it is no element of the aggregate around it.
    attribute: bool,
}

impl Parser {
    pub(super) fn new() -> Parser {
        Parser {
            at: 0,
            searched: 0,
            string_end: None,
            open: Vec::new(),
            values: MAX_VALUES,
            examined: 0,
        }
    }

    /// Parses the reply at the front of `buf`: `None` if more bytes are needed, and then the
    /// next call must be given the same bytes, and perhaps more after them. A reply that
    /// breaks one of the limits is an `InvalidData` error as soon as its header says so.
    /// After a reply or an error, the next call starts a new reply.
    pub(super) fn parse(&mut self, buf: &[u8]) -> io::Result<Option<(Reply, usize)>> {
        let scanned = self.scan(buf);
        if !matches!(scanned, Ok(None)) {
            self.restart();
        }
        let Some(end) = scanned? else {
            return Ok(None);
        };
        let (reply, built) = build(&buf[..end], 0)?;
        debug_assert_eq!(
            built, end,
            "the scan and the build disagree on where it ends"
        );
        Ok(Some((reply, end)))
    }

    #[cfg(test)]
    pub(super) fn examined(&self) -> usize {
        self.examined
    }

    fn looked_at(&mut self, bytes: usize) {
        self.examined = self.examined.saturating_add(bytes);
    }

    fn restart(&mut self) {
        self.at = 0;
        self.searched = 0;
        self.string_end = None;
        // Kept, not freed: the next reply will likely nest as this one did.
        self.open.clear();
        self.values = MAX_VALUES;
    }

    /// Where the reply at the front of `buf` ends, once it is all there.
    fn scan(&mut self, buf: &[u8]) -> io::Result<Option<usize>> {
        // Nothing past the limit can belong to the reply: not looking there bounds the scans for
        // line ends, and a reply still incomplete within it never will be complete.
        let within = &buf[..buf.len().min(MAX_REPLY_BYTES)];
        loop {
            let complete = if let Some(end) = self.string_end {
                if within.len() < end {
                    break;
                }
                self.looked_at(2);
                // Anything else there means the stream has lost its framing.
                if &within[end - 2..end] != b"\r\n" {
                    return Err(protocol_error("a bulk string not followed by CRLF"));
                }
                self.string_end = None;
                self.at = end;
                self.element_ended()
            } else {
                // A type byte no reply starts with is refused at once, not after its line
                // (which may never end: a server that speaks another protocol).
                // (A CR there is an empty line, which its own error names.)
                let stray = |&&k: &&u8| !is_type_byte(k) && k != b'\r';
                if let Some(&kind) = within.get(self.at).filter(stray) {
                    return Err(not_a_type_byte(kind));
                }
                let Some(end) = self.line_end(within) else {
                    break;
                };
                let header = header(&within[self.at..end])?;
                self.at = end + 2;
                self.searched = 0;
                match header {
                    Header::Line(..) | Header::Int(_) => self.element_ended(),
                    Header::String(_, -1) | Header::Aggregate(_, -1) => self.element_ended(),
                    Header::String(_, len) => {
                        let end = usize::try_from(len)
                            .ok()
                            .and_then(|len| self.at.checked_add(len)?.checked_add(2))
                            .filter(|&end| end <= MAX_REPLY_BYTES)
                            .ok_or_else(reply_too_long)?;
                        self.string_end = Some(end);
                        false
                    }
                    Header::Aggregate(kind, count) => self.opened(kind, count)?,
                }
            };
            if complete {
                return Ok(Some(self.at));
            }
        }
        if buf.len() >= MAX_REPLY_BYTES {
            return Err(reply_too_long());
        }
        Ok(None)
    }

    /// Where the line at `at` ends (its CR), searching only what was not searched before.
    fn line_end(&mut self, within: &[u8]) -> Option<usize> {
        // A line's LF comes after its CR, so never at `at` itself.
        let mut from = self.at + self.searched.max(1);
        while from < within.len() {
            let Some(lf) = within[from..].iter().position(|&b| b == b'\n') else {
                break;
            };
            self.looked_at(lf + 1);
            let lf = from + lf;
            if within[lf - 1] == b'\r' {
                return Some(lf - 1);
            }
            from = lf + 1;
        }
        self.looked_at(within.len().saturating_sub(from));
        self.searched = within.len() - self.at;
        None
    }

    /// Takes the header of an aggregate of `count` entries (not negative) at the current
    /// depth: whether the reply is then complete.
    fn opened(&mut self, kind: u8, count: i64) -> io::Result<bool> {
        if self.open.len() >= MAX_DEPTH {
            return Err(limit_error(&format!(
                "aggregates nested more than {MAX_DEPTH} deep"
            )));
        }
        let elements = elements(kind, count)
            .filter(|&elements| elements <= self.values)
            .ok_or_else(|| {
                let before = MAX_VALUES - self.values;
                let after = if before == 0 {
                    String::new()
                } else {
                    format!(" after {before} values")
                };
                limit_error(&format!(
                    "an aggregate of {count} entries{after}, over the {MAX_VALUES} values a \
                     reply may hold"
                ))
            })?;
        self.values -= elements;
        let attribute = kind == b'|';
        if elements > 0 {
            self.open.push(Open {
                left: elements,
                attribute,
            });
            return Ok(false);
        }
        Ok(!attribute && self.element_ended())
    }

    /// Counts a value just ended as an element of the aggregate around it, closing those it
    /// completes: whether the reply is then complete.
    fn element_ended(&mut self) -> bool {
        while let Some(open) = self.open.last_mut() {
            open.left -= 1;
            if open.left > 0 {
                return false;
            }
            let attribute = open.attribute;
            self.open.pop();
            if attribute {
                return false;
            }
        }
        true
    }
}

/// What a line of the protocol announces.
enum Header<'a> {
    /// A value whole on its line (`+`, `-`, `_`, `#`, `,`, `(`): its type byte and text.
    Line(u8, &'a [u8]),
    /// `:`
    Int(i64),
    /// `$`, `!` or `=`: a string of this many bytes follows; negative, a nil.
    String(u8, i64),
    /// `*`, `~`, `>`, `%` or `|`: this many entries follow; negative, a nil array.
    Aggregate(u8, i64),
}

/// Reads a header from its line, CRLF excluded.
fn header(line: &[u8]) -> io::Result<Header<'_>> {
    let Some((&kind, text)) = line.split_first() else {
        return Err(protocol_error("empty line"));
    };
    let number = || -> io::Result<i64> {
        std::str::from_utf8(text)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| protocol_error("not a number"))
    };
    // A length or count of -1 is a nil; any other below 0 is no reply at all (a server that
    // lost its framing, or no Redis), never a nil nor a wait for more (hiredis refuses it
    // too).
    let length = || -> io::Result<i64> {
        match number()? {
            n if n < -1 => Err(protocol_error(&format!("a length of {n}"))),
            n => Ok(n),
        }
    };
    Ok(match kind {
        b'+' | b'-' | b'_' | b'#' | b',' | b'(' => Header::Line(kind, text),
        b':' => Header::Int(number()?),
        b'$' | b'!' | b'=' => Header::String(kind, length()?),
        b'*' | b'~' | b'>' | b'%' | b'|' => Header::Aggregate(kind, length()?),
        other => return Err(not_a_type_byte(other)),
    })
}

/// Whether a reply (or an element of one) may start with `byte`.
fn is_type_byte(byte: u8) -> bool {
    matches!(
        byte,
        b'+' | b'-'
            | b'_'
            | b'#'
            | b','
            | b'('
            | b':'
            | b'$'
            | b'!'
            | b'='
            | b'*'
            | b'~'
            | b'>'
            | b'%'
            | b'|'
    )
}

fn not_a_type_byte(byte: u8) -> io::Error {
    if matches!(byte, b'H' | b'<') {
        return io::Error::new(io::ErrorKind::InvalidData, super::ANSWERED_LIKE_HTTP);
    }
    protocol_error(&format!("unknown type byte {byte:#x}"))
}

/// The values an aggregate of `count` entries holds: a map's and an attribute's entries are
/// pairs.
fn elements(kind: u8, count: i64) -> Option<usize> {
    let per_entry = if matches!(kind, b'%' | b'|') { 2 } else { 1 };
    usize::try_from(count).ok()?.checked_mul(per_entry)
}

/// The value at `buf[at..]`, with where it ends. `buf` holds a reply the scan found complete
/// and within the limits, so its lines end, its strings are there and it nests no deeper than
/// `MAX_DEPTH`; what does not hold is an error all the same, never a panic.
fn build(buf: &[u8], mut at: usize) -> io::Result<(Reply, usize)> {
    let cut_short = || protocol_error("a reply cut short");
    // Attributes describe the reply that follows and are skipped. A loop rather than a
    // recursion, so that a chain of them takes no stack either.
    loop {
        let end = buf
            .get(at..)
            .ok_or_else(cut_short)?
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or_else(cut_short)?;
        let after = at + end + 2;
        let text = |line: &[u8]| String::from_utf8_lossy(line).into_owned();
        let built = match header(&buf[at..at + end])? {
            Header::Line(b'+', line) => (Reply::Status(text(line)), after),
            Header::Line(b'-', line) => (Reply::Error(text(line)), after),
            Header::Line(b'#', line) => (Reply::Int((line == b"t") as i64), after),
            Header::Line(b',' | b'(', line) => (Reply::Bulk(Some(line.to_vec())), after),
            // `_`, null.
            Header::Line(..) => (Reply::Bulk(None), after),
            Header::Int(i) => (Reply::Int(i), after),
            Header::String(_, len) if len < 0 => (Reply::Bulk(None), after),
            Header::String(kind, len) => {
                let end = usize::try_from(len)
                    .ok()
                    .and_then(|len| after.checked_add(len))
                    .ok_or_else(cut_short)?;
                let data = buf.get(after..end).ok_or_else(cut_short)?;
                let reply = match kind {
                    b'!' => Reply::Error(text(data)),
                    // Verbatim strings start with a format, "txt:".
                    b'=' => Reply::Bulk(Some(data[4.min(data.len())..].to_vec())),
                    _ => Reply::Bulk(Some(data.to_vec())),
                };
                (reply, end + 2)
            }
            Header::Aggregate(_, count) if count < 0 => (Reply::Array(None), after),
            Header::Aggregate(kind, count) => {
                let elements = elements(kind, count).ok_or_else(cut_short)?;
                let mut items = Vec::with_capacity(elements.min(PREALLOCATED));
                at = after;
                for _ in 0..elements {
                    let (item, end) = build(buf, at)?;
                    items.push(item);
                    at = end;
                }
                match kind {
                    b'|' => continue,
                    b'>' => (Reply::Push(items), at),
                    _ => (Reply::Array(Some(items)), at),
                }
            }
        };
        return Ok(built);
    }
}

pub(super) fn reply_too_long() -> io::Error {
    limit_error(&format!(
        "a reply longer than the {} MiB this client reads",
        MAX_REPLY_BYTES >> 20
    ))
}
