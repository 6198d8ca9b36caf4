//! The journal of the local configuration (pure: its format and how a start reads it back).
//!
//! Why: a change of the local configuration (a CNI ADD, a `vnetctl route replace`) must be on
//! disk before it is acknowledged. Writing `config.vnet` whole for each costs the
//! configuration's size (8,000 route lines at 1,000 hosts' worth), so the daemon's CPU per
//! change grew with the overlay. Instead each acknowledged change is appended here as one
//! record, and the whole file is rewritten (compacted) in the background once the journal has
//! grown past a bound proportional to the file: the cost per change is flat, and the
//! compactions' cost, spread over the changes between two of them, is too.
//!
//! Files (in the state directory): `config.vnet` begins with [`header`], which says the
//! sequence number of the last record it includes; the records after it are in segments
//! `config.journal.<16 hex digits: the first record's sequence>`. A segment is started when
//! the file is compacted, so segments hold consecutive runs of records and every segment whose
//! first record is at or below the file's sequence is wholly in the file (and is deleted after
//! the file is durable).
//!
//! A record: `[u32 LE payload length][u32 LE CRC-32 of the next 8 + length bytes]
//! [u64 LE sequence][payload]`, the payload a kind byte ([`Kind`]) and UTF-8 control-language
//! lines. Reading a segment stops at the first record that is short (a write torn by a crash
//! or by a full disk), has a bad checksum, a length beyond [`MAX_PAYLOAD`] or a sequence that
//! does not follow: nothing after it in that segment can be read safely. A write that failed is
//! never acknowledged (the daemon undoes the change), and the next record goes to a new segment
//! with the same sequence, so a tail cut short this way is no loss.
//!
//! A start replays the records after the file's sequence, in order. Should a record be missing
//! all the same (a segment damaged or lost on disk), the records after it are still replayed,
//! on top of what came before, and the hole is said as a warning: the changes after it were
//! acknowledged, and dropping them all (as a stop at the hole did) loses more than it keeps.
//! A `config.vnet` without a header (written by a vnetd before the journal, or edited by
//! hand) is newer than every segment beside it: those are not replayed over it.
//!
//! Sequences stay below [`SEQ_LIMIT`]: a header, a segment's name or a record beyond it is
//! damage (no start adds one to `u64::MAX`), and the journal refuses to number a record there.

use std::fmt;

/// The first line of `config.vnet` (a comment for the control language, so an older vnetd
/// reads the file as before).
const HEADER_PREFIX: &str = "# vnet state: includes the journal up to record ";

/// Segment files: this prefix and the first record's sequence in 16 hex digits.
pub const SEGMENT_PREFIX: &str = "config.journal.";

/// Bytes before a record's payload: length, checksum, sequence.
const RECORD_HEAD: usize = 16;

/// The largest payload a record may have: a snapshot record holds the whole local
/// configuration (at most 100,000 routes of at most about 100 bytes, 4,096 ports of at most
/// about 300, and the rest: about 11 MiB; tested), and a change whose lines would be longer
/// is saved as a snapshot instead. A length beyond it is damage, not a record.
pub const MAX_PAYLOAD: usize = 16 << 20;

/// Sequences are below this (2^63: a daemon appending a million records a second takes
/// 290,000 years to reach it); one at or beyond it is damage.
pub const SEQ_LIMIT: u64 = 1 << 63;

/// What a record's lines mean.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Commands applied on top of the configuration so far.
    Delta,
    /// The whole local configuration: replaces what came before (a change the journal cannot
    /// say as commands, such as a setting going back to its default).
    Snapshot,
}

impl Kind {
    fn byte(self) -> u8 {
        match self {
            Kind::Delta => b'D',
            Kind::Snapshot => b'S',
        }
    }

    fn of(b: u8) -> Option<Kind> {
        match b {
            b'D' => Some(Kind::Delta),
            b'S' => Some(Kind::Snapshot),
            _ => None,
        }
    }
}

/// One record read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub seq: u64,
    pub kind: Kind,
    pub text: String,
}

/// `config.vnet`'s first line for a file that includes the records up to `seq`.
pub fn header(seq: u64) -> String {
    format!("{HEADER_PREFIX}{seq}\n")
}

/// What `config.vnet` says of the journal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Base {
    /// There is no `config.vnet`: the journal's records, from the first, are the configuration.
    NoFile,
    /// A file without a header (or with one beyond [`SEQ_LIMIT`]): written by a vnetd that knows
    /// no journal, or edited by hand, after every segment beside it.
    Unnumbered,
    /// The file includes the records up to this one.
    Includes(u64),
}

/// What a `config.vnet`'s text (None: no file) says of the journal.
pub fn base(text: Option<&str>) -> Base {
    match text {
        None => Base::NoFile,
        Some(t) => match file_sequence(t) {
            Some(seq) => Base::Includes(seq),
            None => Base::Unnumbered,
        },
    }
}

/// The sequence a `config.vnet` says it includes (None without a header, or with one that
/// cannot be: at or beyond [`SEQ_LIMIT`]).
pub fn file_sequence(text: &str) -> Option<u64> {
    text.lines()
        .next()
        .and_then(|l| l.strip_prefix(HEADER_PREFIX))
        .and_then(|n| n.trim().parse().ok())
        .filter(|&n| n < SEQ_LIMIT)
}

/// The sequence after `last`, None when the journal cannot number another record.
pub fn next_seq(last: u64) -> Option<u64> {
    last.checked_add(1).filter(|&n| n < SEQ_LIMIT)
}

/// A segment's file name.
pub fn segment_name(first_seq: u64) -> String {
    format!("{SEGMENT_PREFIX}{first_seq:016x}")
}

/// The first sequence a segment's file name says (None: not a segment's name). A name with
/// a sequence at or beyond [`SEQ_LIMIT`] is a segment's, damaged: [`replay`] leaves it out.
pub fn segment_first(name: &str) -> Option<u64> {
    let hex = name.strip_prefix(SEGMENT_PREFIX)?;
    if hex.len() != 16 {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}

/// One record's bytes.
pub fn encode(seq: u64, kind: Kind, text: &str) -> Vec<u8> {
    let len = text.len() + 1;
    let mut out = Vec::with_capacity(RECORD_HEAD + len);
    out.extend_from_slice(&(len as u32).to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&seq.to_le_bytes());
    out.push(kind.byte());
    out.extend_from_slice(text.as_bytes());
    let crc = crc32fast::hash(&out[8..]);
    out[4..8].copy_from_slice(&crc.to_le_bytes());
    out
}

/// Why reading a segment stopped before its end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stop {
    /// The bytes end inside a record (a write torn by a crash).
    Torn,
    /// A record's checksum, length, kind or text is wrong.
    Damaged(&'static str),
    /// A record's sequence does not follow the one before it.
    OutOfSequence { expected: u64, found: u64 },
}

impl fmt::Display for Stop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Stop::Torn => write!(f, "a record torn short"),
            Stop::Damaged(what) => write!(f, "a damaged record ({what})"),
            Stop::OutOfSequence { expected, found } => {
                write!(f, "record {found} where {expected} was expected")
            }
        }
    }
}

/// A segment read back: its whole records, and where and why reading stopped early (None:
/// at the end of the bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded {
    pub records: Vec<Record>,
    pub stopped: Option<(usize, Stop)>,
}

/// Reads a segment's records in order (each must follow the one before it).
pub fn decode(bytes: &[u8]) -> Decoded {
    let mut records: Vec<Record> = Vec::new();
    let mut at = 0;
    let stop = |at: usize, why: Stop, records: Vec<Record>| Decoded {
        records,
        stopped: Some((at, why)),
    };
    while at < bytes.len() {
        let rest = &bytes[at..];
        if rest.len() < RECORD_HEAD {
            return stop(at, Stop::Torn, records);
        }
        let word = |i: usize| u32::from_le_bytes([rest[i], rest[i + 1], rest[i + 2], rest[i + 3]]);
        let len = word(0) as usize;
        if len == 0 || len > MAX_PAYLOAD + 1 {
            // Zeros are what a file system shows for a block allocated but never written.
            return stop(at, Stop::Damaged("length"), records);
        }
        if rest.len() < RECORD_HEAD + len {
            return stop(at, Stop::Torn, records);
        }
        let body = &rest[8..RECORD_HEAD + len];
        if crc32fast::hash(body) != word(4) {
            return stop(at, Stop::Damaged("checksum"), records);
        }
        let mut seq_bytes = [0u8; 8];
        seq_bytes.copy_from_slice(&rest[8..16]);
        let seq = u64::from_le_bytes(seq_bytes);
        if seq >= SEQ_LIMIT {
            return stop(at, Stop::Damaged("sequence"), records);
        }
        if let Some(prev) = records.last() {
            // Below SEQ_LIMIT: no overflow.
            if seq != prev.seq + 1 {
                let expected = prev.seq + 1;
                return stop(
                    at,
                    Stop::OutOfSequence {
                        expected,
                        found: seq,
                    },
                    records,
                );
            }
        }
        let Some(kind) = Kind::of(rest[RECORD_HEAD]) else {
            return stop(at, Stop::Damaged("kind"), records);
        };
        let Ok(text) = std::str::from_utf8(&rest[RECORD_HEAD + 1..RECORD_HEAD + len]) else {
            return stop(at, Stop::Damaged("text"), records);
        };
        records.push(Record {
            seq,
            kind,
            text: text.to_string(),
        });
        at += RECORD_HEAD + len;
    }
    Decoded {
        records,
        stopped: None,
    }
}

/// What a start replays: the records after the file's sequence, in order.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Replay {
    pub records: Vec<Record>,
    /// The highest sequence found anywhere (the file's, a segment's name, a record's, replayed
    /// or not; below [`SEQ_LIMIT`]): the next record's sequence follows it, so nothing left on
    /// disk is taken for a newer record.
    pub highest: u64,
    /// What was not replayed and is no loss (a tail a crash or a failed write cut short), in
    /// words.
    pub notes: Vec<String>,
    /// What may be a loss (a record missing before others, segments older than the file or
    /// damaged), in words: the daemon logs them as warnings.
    pub warnings: Vec<String>,
}

/// Plans the replay: `base` from `config.vnet`, `segments` as (first sequence, bytes) in any
/// order.
pub fn replay(base: Base, segments: &mut [(u64, Vec<u8>)]) -> Replay {
    segments.sort_by_key(|(first, _)| *first);
    let file_seq = match base {
        Base::Includes(n) => n,
        Base::NoFile | Base::Unnumbered => 0,
    };
    let mut out = Replay {
        highest: file_seq,
        ..Replay::default()
    };
    // Below SEQ_LIMIT (file_sequence, decode): no overflow.
    let mut next = file_seq + 1;
    for (first, bytes) in segments.iter() {
        let name = segment_name(*first);
        if *first >= SEQ_LIMIT {
            out.warnings.push(format!(
                "journal segment {name}: left out (its name says a sequence no journal reaches: damaged)"
            ));
            continue;
        }
        out.highest = out.highest.max(*first);
        let d = decode(bytes);
        if let Some(last) = d.records.last() {
            out.highest = out.highest.max(last.seq);
        }
        if base == Base::Unnumbered {
            if !d.records.is_empty() {
                out.warnings.push(format!(
                    "journal segment {name}: left out: config.vnet has no journal header (written by an older vnetd, or edited), so it is newer than the segment"
                ));
            }
            continue;
        }
        for r in d.records {
            if r.seq < next {
                continue; // already in the file
            }
            if r.seq != next {
                out.warnings.push(format!(
                    "journal segment {name}: records {next} to {} are missing (damaged or lost on disk): the changes after them are replayed on top of what came before; check the configuration",
                    r.seq - 1
                ));
            }
            next = r.seq + 1;
            out.records.push(r);
        }
        if let Some((at, why)) = d.stopped {
            let left = bytes.len() - at;
            // A record cut short, or blocks allocated and never written, at the end: a
            // write a crash or a failed write interrupted, which nobody was told had worked.
            // Anything else there is damage to what may have been acknowledged.
            if why == Stop::Torn || bytes[at..].iter().all(|&b| b == 0) {
                out.notes.push(format!(
                    "journal segment {name}: {left} bytes from offset {at} ignored: {why} (a change never acknowledged: cut short by a crash or a failed write)"
                ));
            } else {
                out.warnings.push(format!(
                    "journal segment {name}: {left} bytes from offset {at} ignored: {why}: the changes they held, if any, are lost; check the configuration"
                ));
            }
        }
    }
    out
}

/// Whether the journal should be folded into the file: once it holds more than the file
/// itself (and at least `floor` bytes), so that each compaction, which costs the file's size,
/// is paid for by at least as many bytes of changes.
pub fn due(journal_bytes: u64, file_bytes: u64, floor: u64) -> bool {
    journal_bytes > floor.max(file_bytes)
}

#[cfg(test)]
mod tests;
