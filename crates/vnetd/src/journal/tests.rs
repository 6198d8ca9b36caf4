//! Tests of `journal.rs`: the format read back, torn and damaged tails, and what a start
//! replays from segments in any state a crash can leave them.

use super::*;

/// The sequences a replay would apply.
fn seqs(r: &Replay) -> Vec<u64> {
    r.records.iter().map(|r| r.seq).collect()
}

fn records(seqs: std::ops::RangeInclusive<u64>) -> Vec<u8> {
    seqs.flat_map(|s| {
        encode(
            s,
            Kind::Delta,
            &format!("route add any 02:00:00:00:00:{s:02x} link l\n"),
        )
    })
    .collect()
}

#[test]
fn records_read_back_as_written() {
    let mut bytes = encode(7, Kind::Delta, "interface add a tap\n");
    bytes.extend(encode(8, Kind::Snapshot, ""));
    bytes.extend(encode(
        9,
        Kind::Delta,
        "set learn on\nroute del any any link x\n",
    ));
    let d = decode(&bytes);
    assert_eq!(d.stopped, None);
    assert_eq!(
        d.records,
        [
            Record {
                seq: 7,
                kind: Kind::Delta,
                text: "interface add a tap\n".into()
            },
            Record {
                seq: 8,
                kind: Kind::Snapshot,
                text: String::new()
            },
            Record {
                seq: 9,
                kind: Kind::Delta,
                text: "set learn on\nroute del any any link x\n".into()
            },
        ]
    );
}

#[test]
fn a_torn_tail_is_ignored_wherever_it_is_cut() {
    let whole = records(1..=3);
    let two = encode(1, Kind::Delta, "route add any 02:00:00:00:00:01 link l\n").len()
        + encode(2, Kind::Delta, "route add any 02:00:00:00:00:02 link l\n").len();
    // Every cut inside the third record keeps the first two and says where it stopped.
    for cut in two + 1..whole.len() {
        let d = decode(&whole[..cut]);
        assert_eq!(d.records.len(), 2, "cut at {cut}");
        assert_eq!(d.stopped, Some((two, Stop::Torn)), "cut at {cut}");
    }
    assert_eq!(decode(&whole[..two]).stopped, None);
}

#[test]
fn damage_stops_reading_there() {
    let whole = records(1..=3);
    let first = encode(1, Kind::Delta, "route add any 02:00:00:00:00:01 link l\n").len();
    // A flipped bit in the second record's text.
    let mut bad = whole.clone();
    bad[first + 20] ^= 1;
    let d = decode(&bad);
    assert_eq!(d.records.len(), 1);
    assert_eq!(d.stopped, Some((first, Stop::Damaged("checksum"))));
    // Zeros where the file system allocated but never wrote.
    let mut zeros = whole[..first].to_vec();
    zeros.extend([0u8; 64]);
    assert_eq!(
        decode(&zeros).stopped,
        Some((first, Stop::Damaged("length")))
    );
    // A length far beyond any record.
    let mut huge = whole[..first].to_vec();
    huge.extend(u32::MAX.to_le_bytes());
    huge.extend([0u8; 40]);
    assert_eq!(
        decode(&huge).stopped,
        Some((first, Stop::Damaged("length")))
    );
    // A gap in the sequence.
    let mut gap = encode(1, Kind::Delta, "");
    gap.extend(encode(3, Kind::Delta, ""));
    assert_eq!(
        decode(&gap).stopped.map(|(_, s)| s),
        Some(Stop::OutOfSequence {
            expected: 2,
            found: 3
        })
    );
}

#[test]
fn names_and_headers_read_back() {
    assert_eq!(segment_first(&segment_name(0x1234)), Some(0x1234));
    assert_eq!(segment_first("config.journal.12"), None);
    assert_eq!(segment_first("config.vnet"), None);
    let text = format!("{}interface add a tap\n", header(42));
    assert_eq!(file_sequence(&text), Some(42));
    assert_eq!(base(Some(&text)), Base::Includes(42));
    // The header is a comment: the control language skips it.
    assert!(matches!(
        vnet_control::parse_line(header(42).trim_end()),
        Ok(None)
    ));
    assert_eq!(file_sequence("interface add a tap\n"), None);
    assert_eq!(base(Some("interface add a tap\n")), Base::Unnumbered);
    assert_eq!(base(Some("")), Base::Unnumbered);
    assert_eq!(base(None), Base::NoFile);
}

/// Sequences at or beyond SEQ_LIMIT are damage wherever they appear (a header, a segment's
/// name, a record), never a sequence to add one to: no overflow, and nothing replayed over
/// newer state because a number wrapped.
#[test]
fn sequences_cannot_wrap() {
    assert_eq!(file_sequence(&header(u64::MAX)), None);
    assert_eq!(file_sequence(&header(SEQ_LIMIT)), None);
    assert_eq!(file_sequence(&header(SEQ_LIMIT - 1)), Some(SEQ_LIMIT - 1));
    assert_eq!(next_seq(u64::MAX), None);
    assert_eq!(next_seq(SEQ_LIMIT - 1), None);
    assert_eq!(next_seq(7), Some(8));
    // A record numbered at the end of u64, and one after it.
    let mut bytes = encode(u64::MAX, Kind::Delta, "set learn on\n");
    bytes.extend(encode(0, Kind::Delta, "set learn off\n"));
    let d = decode(&bytes);
    assert!(d.records.is_empty());
    assert_eq!(d.stopped, Some((0, Stop::Damaged("sequence"))));
    // A file whose header says u64::MAX is unnumbered: the segments beside it (from 1) are
    // older than it and not replayed, and nothing overflows.
    let r = replay(
        base(Some(&header(u64::MAX))),
        &mut [(1, records(1..=3)), (u64::MAX, records(4..=5))],
    );
    assert!(r.records.is_empty(), "{:?}", seqs(&r));
    assert_eq!(r.highest, 3);
    assert!(
        r.warnings.iter().any(|w| w.contains("ffffffffffffffff")),
        "{:?}",
        r.warnings
    );
    // A segment whose name is damaged is left out, and does not lift the numbering.
    let r = replay(Base::Includes(2), &mut [(SEQ_LIMIT + 5, records(3..=4))]);
    assert!(r.records.is_empty() && r.highest == 2, "{r:?}");
}

#[test]
fn a_start_replays_what_the_file_lacks_in_order() {
    // File at 4; segment 3..=6 (written before a compaction that is in the file up to 4) and
    // segment 7..=8, given out of order.
    let mut segs = vec![(7, records(7..=8)), (3, records(3..=6))];
    let r = replay(Base::Includes(4), &mut segs);
    assert_eq!(seqs(&r), [5, 6, 7, 8]);
    assert!(r.notes.is_empty() && r.warnings.is_empty(), "{r:?}");
    assert_eq!(r.highest, 8);
    // Nothing after the file: nothing to replay, and the segment's records are not new.
    let r = replay(Base::Includes(8), &mut [(7, records(7..=8))]);
    assert!(r.records.is_empty());
    assert_eq!(r.highest, 8);
    // An empty segment (made, nothing synced into it) still counts for the next sequence.
    let r = replay(Base::Includes(2), &mut [(9, vec![])]);
    assert!(r.records.is_empty() && r.notes.is_empty());
    assert_eq!(r.highest, 9);
    // No file yet (a first start that crashed before writing it): every record, from 1.
    let r = replay(Base::NoFile, &mut [(1, records(1..=3))]);
    assert_eq!(seqs(&r), [1, 2, 3]);
}

/// A file without a header is newer than the segments beside it (an older vnetd wrote it
/// after a newer one crashed, leaving them): they are not replayed over it, and that is said.
#[test]
fn segments_beside_an_unnumbered_file_are_older_than_it() {
    let r = replay(
        Base::Unnumbered,
        &mut [(1, records(1..=3)), (4, records(4..=4))],
    );
    assert!(r.records.is_empty(), "{:?}", seqs(&r));
    assert_eq!(r.warnings.len(), 2, "{:?}", r.warnings);
    assert!(
        r.warnings[0].contains("no journal header"),
        "{:?}",
        r.warnings
    );
    // They still count for the numbering, so no later record is taken for one of theirs.
    assert_eq!(r.highest, 4);
}

/// A missing record (a segment damaged or lost) does not drop the acknowledged records after
/// it: they are replayed, and the hole is a warning.
#[test]
fn a_start_replays_past_a_missing_record_and_warns() {
    // Record 6 lost: 7 and 8 are replayed all the same.
    let mut segs = vec![(3, records(3..=5)), (7, records(7..=8))];
    let r = replay(Base::Includes(2), &mut segs);
    assert_eq!(seqs(&r), [3, 4, 5, 7, 8]);
    assert_eq!(r.warnings.len(), 1, "{:?}", r.warnings);
    assert!(
        r.warnings[0].contains("records 6 to 6 are missing"),
        "{:?}",
        r.warnings
    );
    assert_eq!(r.highest, 8);
    // A damaged record inside a segment: what follows in it is unreadable, the next segment
    // is replayed.
    let mut bad = records(3..=5);
    let one = encode(3, Kind::Delta, "route add any 02:00:00:00:00:03 link l\n").len();
    bad[one + 20] ^= 1;
    let r = replay(Base::Includes(2), &mut [(3, bad), (6, records(6..=7))]);
    assert_eq!(seqs(&r), [3, 6, 7]);
    assert_eq!(r.warnings.len(), 2, "{:?}", r.warnings);
    // A torn tail in the last segment, and a failed write's tail followed by the segment that
    // took its sequence: said, no warning, everything replayed.
    let mut torn = records(3..=5);
    torn.truncate(torn.len() - 3);
    let r = replay(Base::Includes(2), &mut [(3, torn.clone())]);
    assert_eq!(r.records.len(), 2);
    assert_eq!(r.notes.len(), 1);
    assert!(r.notes[0].contains("torn"), "{:?}", r.notes);
    assert!(r.warnings.is_empty());
    let r = replay(Base::Includes(2), &mut [(3, torn), (5, records(5..=6))]);
    assert_eq!(seqs(&r), [3, 4, 5, 6]);
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);
    // Zeros at the end (blocks allocated, never written): a note too.
    let mut zeros = records(3..=4);
    zeros.extend([0u8; 100]);
    let r = replay(Base::Includes(2), &mut [(3, zeros)]);
    assert_eq!(seqs(&r), [3, 4]);
    assert!(r.warnings.is_empty() && r.notes.len() == 1, "{r:?}");
}

#[test]
fn compaction_is_due_past_the_file_size() {
    assert!(!due(10, 1000, 64));
    assert!(due(1001, 1000, 64));
    assert!(!due(50, 0, 64));
    assert!(due(65, 0, 64));
}
