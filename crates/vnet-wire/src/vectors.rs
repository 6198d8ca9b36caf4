//! Known vectors for the views' tests: frames the Linux kernel made (see
//! `testdata/kernel-frames.txt` and the script that captured them), so the views are checked
//! against an independent implementation, not only against themselves.

const KERNEL_FRAMES: &str = include_str!("../testdata/kernel-frames.txt");

/// The bytes of the kernel's frame `name`.
pub(crate) fn frame(name: &str) -> Vec<u8> {
    let line = KERNEL_FRAMES
        .lines()
        .find(|l| l.split(' ').next() == Some(name))
        .unwrap_or_else(|| panic!("no kernel frame {name}"));
    let hex = line.split(' ').nth(1).expect("hex");
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex digit"))
        .collect()
}

/// The frame's payload past its 14-byte Ethernet header.
pub(crate) fn l3(name: &str) -> Vec<u8> {
    frame(name)[14..].to_vec()
}
