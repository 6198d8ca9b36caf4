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
    assert_eq!(file_sequence(&text), 42);
    // The header is a comment: the control language skips it.
    assert!(matches!(
        vnet_control::parse_line(header(42).trim_end()),
        Ok(None)
    ));
    assert_eq!(file_sequence("interface add a tap\n"), 0);
    assert_eq!(file_sequence(""), 0);
}

#[test]
fn a_start_replays_what_the_file_lacks_in_order() {
    // File at 4; segment 3..=6 (written before a compaction that is in the file up to 4) and
    // segment 7..=8, given out of order.
    let mut segs = vec![(7, records(7..=8)), (3, records(3..=6))];
    let r = replay(4, &mut segs);
    assert_eq!(seqs(&r), [5, 6, 7, 8]);
    assert!(r.notes.is_empty(), "{:?}", r.notes);
    assert_eq!(r.highest, 8);
    // Nothing after the file: nothing to replay, and the segment's records are not new.
    let r = replay(8, &mut [(7, records(7..=8))]);
    assert!(r.records.is_empty());
    assert_eq!(r.highest, 8);
    // An empty segment (made, nothing synced into it) still counts for the next sequence.
    let r = replay(2, &mut [(9, vec![])]);
    assert!(r.records.is_empty() && r.notes.is_empty());
    assert_eq!(r.highest, 9);
}

#[test]
fn a_start_stops_at_a_missing_record_and_says_so() {
    // Record 6 lost: 7 and 8 cannot be applied without it.
    let mut segs = vec![(3, records(3..=5)), (7, records(7..=8))];
    let r = replay(2, &mut segs);
    assert_eq!(seqs(&r), [3, 4, 5]);
    assert_eq!(r.notes.len(), 1, "{:?}", r.notes);
    assert!(r.notes[0].contains("record 7 where 6"), "{:?}", r.notes);
    assert_eq!(r.highest, 8);
    // A torn tail in the last segment: said, the rest replayed.
    let mut torn = records(3..=5);
    torn.truncate(torn.len() - 3);
    let r = replay(2, &mut [(3, torn)]);
    assert_eq!(r.records.len(), 2);
    assert_eq!(r.notes.len(), 1);
    assert!(r.notes[0].contains("torn"), "{:?}", r.notes);
}

#[test]
fn compaction_is_due_past_the_file_size() {
    assert!(!due(10, 1000, 64));
    assert!(due(1001, 1000, 64));
    assert!(!due(50, 0, 64));
    assert!(due(65, 0, 64));
}
