//! The programs' own cost as the kernel measures it (`BPF_PROG_TEST_RUN` with `repeat`): a
//! measurement run by hand, not a check (`cargo test --release -p vnet-fastpath --test bpf --
//! --ignored --nocapture timing`, as root, on a machine as quiet as can be had). It prints
//! the mean time of one run of `port_ingress` forwarding port to port, on one CPU and on two
//! CPUs at once: both forwarding the same (source, destination) pair (what a traffic matrix
//! shared by the CPUs would make them contend on; it is per CPU), or each its own pair (the
//! two directions of a TCP connection).

use crate::helpers::*;
use vnet_fastpath::*;

const REPEAT: u32 = 2_000_000;
const ROUNDS: usize = 7;

fn pin_to(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET writes inside it for cpu < 1024.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        assert_eq!(
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set),
            0,
            "pin to CPU {cpu}"
        );
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[test]
#[ignore = "a measurement, run by hand"]
fn timing_of_port_to_port_with_the_matrix() {
    let Some(l) = lab() else { return };
    let ab = frame(B, A, 64);
    let ba = frame(A, B, 64);
    assert_eq!(l.run_from_a(&ab).verdict, TCX_REDIRECT);
    let run = |cpu: usize, f: &[u8], ifindex: u32| -> f64 {
        pin_to(cpu);
        let d =
            l.fp.time_runs(Program::PortIngress, f, ifindex, REPEAT)
                .expect("test run");
        d.as_nanos() as f64
    };
    let (mut one, mut same, mut own) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        one.push(run(0, &ab, l.pa));
        let (x, y) = std::thread::scope(|s| {
            let a = s.spawn(|| run(0, &ab, l.pa));
            let b = s.spawn(|| run(1, &ab, l.pa));
            (a.join().expect("cpu 0"), b.join().expect("cpu 1"))
        });
        same.push((x + y) / 2.0);
        let (x, y) = std::thread::scope(|s| {
            let a = s.spawn(|| run(0, &ab, l.pa));
            let b = s.spawn(|| run(1, &ba, l.pb));
            (a.join().expect("cpu 0"), b.join().expect("cpu 1"))
        });
        own.push((x + y) / 2.0);
    }
    println!(
        "port_ingress, ns per run (median of {ROUNDS} x {REPEAT}): one CPU {:.1}; two CPUs, one pair {:.1}; two CPUs, a pair each {:.1}",
        median(one.clone()),
        median(same.clone()),
        median(own.clone())
    );
    println!("one CPU {one:?}\ntwo CPUs, one pair {same:?}\ntwo CPUs, a pair each {own:?}");
    let m = l.fp.matrix().expect("matrix");
    assert_eq!(m.len(), 2, "{m:?}");
}
