//! Data-message AEAD throughput on this CPU, one core: AES-256-GCM and ChaCha20-Poly1305,
//! seal and open in place, for 1,400 and 9,000-byte messages, through ring (what vnet-crypto
//! uses), aws-lc-rs (with `--features bench-aws-lc`: it builds AWS-LC) and snow's own
//! transport (the per-message RustCrypto implementation vnet used before, out of place plus
//! the copy back that an in-place caller needs), and through vnet-crypto's `Session` batch API
//! (counter reservation, header, replay window included).
//!
//! ```text
//! cargo run --release -p vnet-crypto --example aead_bench [-- --runs 7 --secs 0.25 --sizes 1400,9000]
//! cargo run --release -p vnet-crypto --features bench-aws-lc --example aead_bench
//! ```
//!
//! Each figure is the median of `--runs` runs (each at least `--secs` of timed work) with the
//! lowest and highest run beside it. The runs of all configurations are interleaved, so that a
//! burst of load from elsewhere on the machine lands on all of them alike. GB/s counts
//! plaintext bytes (10^9 per second). Two figures per run: by the wall clock, and by the time
//! this thread was actually on a CPU (the kernel's schedstat), which a loaded machine disturbs
//! less (it still shares caches and memory bandwidth with the load).

use std::time::{Duration, Instant};

use vnet_crypto::{Cipher, Ciphers, Message, Now, Peer, PrivateKey, Session, Timers};
use vnet_crypto::{DATA_HEADER_LEN, TAG_LEN};

/// Messages per timed batch: enough to run the cipher at its pace, and small enough (with
/// 9,000-byte messages, about 600 KB) to stay in the L2 cache as a receive batch would.
const BATCH: usize = 64;

/// One thing measured: seals and opens whole batches of datagrams laid out as
/// `[16-byte header][plaintext][16-byte tag]`, in place.
trait Subject {
    fn seal(&mut self, bufs: &mut [Vec<u8>]);
    /// Opens what the last `seal` produced; panics if any fails (a broken benchmark).
    fn open(&mut self, bufs: &mut [Vec<u8>]);
}

fn nonce_bytes(counter: u64) -> [u8; 12] {
    let mut n = [0u8; 12];
    n[4..].copy_from_slice(&counter.to_le_bytes());
    n
}

/// ring's or aws-lc-rs's `LessSafeKey` (the two crates share the API).
macro_rules! less_safe_key_subject {
    ($name:ident, $krate:ident) => {
        struct $name {
            key: $krate::aead::LessSafeKey,
            counter: u64,
        }

        impl $name {
            fn new(cipher: Cipher) -> Self {
                let alg = match cipher {
                    Cipher::Aes256Gcm => &$krate::aead::AES_256_GCM,
                    Cipher::ChaCha20Poly1305 => &$krate::aead::CHACHA20_POLY1305,
                };
                let key = $krate::aead::UnboundKey::new(alg, &[7u8; 32]).expect("key");
                $name {
                    key: $krate::aead::LessSafeKey::new(key),
                    counter: 0,
                }
            }
        }

        impl Subject for $name {
            fn seal(&mut self, bufs: &mut [Vec<u8>]) {
                for (i, b) in bufs.iter_mut().enumerate() {
                    let n = b.len() - TAG_LEN;
                    let nonce = $krate::aead::Nonce::assume_unique_for_key(nonce_bytes(
                        self.counter + i as u64,
                    ));
                    let tag = self
                        .key
                        .seal_in_place_separate_tag(
                            nonce,
                            $krate::aead::Aad::empty(),
                            &mut b[DATA_HEADER_LEN..n],
                        )
                        .expect("seal");
                    b[n..].copy_from_slice(tag.as_ref());
                }
            }

            fn open(&mut self, bufs: &mut [Vec<u8>]) {
                for (i, b) in bufs.iter_mut().enumerate() {
                    let nonce = $krate::aead::Nonce::assume_unique_for_key(nonce_bytes(
                        self.counter + i as u64,
                    ));
                    self.key
                        .open_in_place(nonce, $krate::aead::Aad::empty(), &mut b[DATA_HEADER_LEN..])
                        .expect("open");
                }
            }
        }
    };
}

less_safe_key_subject!(Ring, ring);
#[cfg(feature = "bench-aws-lc")]
less_safe_key_subject!(AwsLc, aws_lc_rs);

/// snow's transport after a real handshake: out of place, then copied back.
struct Snow {
    a: snow::StatelessTransportState,
    b: snow::StatelessTransportState,
    scratch: Vec<u8>,
}

impl Snow {
    fn new(cipher: Cipher) -> Snow {
        let name = match cipher {
            Cipher::Aes256Gcm => "Noise_NN_25519_AESGCM_BLAKE2s",
            Cipher::ChaCha20Poly1305 => "Noise_NN_25519_ChaChaPoly_BLAKE2s",
        };
        let params: snow::params::NoiseParams = name.parse().expect("params");
        let mut i = snow::Builder::new(params.clone())
            .build_initiator()
            .expect("initiator");
        let mut r = snow::Builder::new(params)
            .build_responder()
            .expect("responder");
        let (mut m, mut p) = ([0u8; 128], [0u8; 128]);
        let n = i.write_message(&[], &mut m).expect("write");
        r.read_message(&m[..n], &mut p).expect("read");
        let n = r.write_message(&[], &mut m).expect("write");
        i.read_message(&m[..n], &mut p).expect("read");
        Snow {
            a: i.into_stateless_transport_mode().expect("transport"),
            b: r.into_stateless_transport_mode().expect("transport"),
            scratch: vec![0; 65536],
        }
    }
}

impl Subject for Snow {
    fn seal(&mut self, bufs: &mut [Vec<u8>]) {
        for (i, b) in bufs.iter_mut().enumerate() {
            let n = b.len() - TAG_LEN;
            let w = self
                .a
                .write_message(i as u64, &b[DATA_HEADER_LEN..n], &mut self.scratch)
                .expect("seal");
            b[DATA_HEADER_LEN..].copy_from_slice(&self.scratch[..w]);
        }
    }

    fn open(&mut self, bufs: &mut [Vec<u8>]) {
        for (i, b) in bufs.iter_mut().enumerate() {
            let r = self
                .b
                .read_message(i as u64, &b[DATA_HEADER_LEN..], &mut self.scratch)
                .expect("open");
            b[DATA_HEADER_LEN..DATA_HEADER_LEN + r].copy_from_slice(&self.scratch[..r]);
        }
    }
}

/// vnet-crypto's own batch API between two peers that agreed on `cipher`: a counter
/// reservation per batch, the header written, the replay window checked and moved.
struct Sessions {
    tx: std::sync::Arc<Session>,
    rx: std::sync::Arc<Session>,
}

impl Sessions {
    fn new(cipher: Cipher) -> Sessions {
        let ciphers = match cipher {
            Cipher::Aes256Gcm => Ciphers::ALL,
            Cipher::ChaCha20Poly1305 => Ciphers::CHACHA_ONLY,
        };
        let (ka, kb) = (PrivateKey([1; 32]), PrivateKey([2; 32]));
        let now = Now {
            mono_ms: 0,
            wall_ns: 1,
        };
        let mut a =
            Peer::new(ka.clone(), kb.public(), 1, Timers::default(), 1).with_ciphers(ciphers);
        let mut b = Peer::new(kb, ka.public(), 1, Timers::default(), 2).with_ciphers(ciphers);
        let init = a.tick(now).expect("initiation");
        let resp = b
            .handle_handshake(&Message::parse(&init).expect("parse"), now)
            .expect("response");
        let mut keepalive = a
            .handle_handshake(&Message::parse(&resp).expect("parse"), now)
            .expect("keepalive");
        let tx = a.sending_session(0).expect("session");
        assert_eq!(tx.cipher(), cipher);
        let rx = b
            .receiving_session(tx.remote_index, 0)
            .expect("receiving session");
        rx.open_in_place(&mut keepalive).expect("keepalive");
        Sessions { tx, rx }
    }
}

impl Subject for Sessions {
    fn seal(&mut self, bufs: &mut [Vec<u8>]) {
        let first = self.tx.reserve(bufs.len() as u64).expect("counters");
        for (i, b) in bufs.iter_mut().enumerate() {
            self.tx.seal_in_place(first + i as u64, b).expect("seal");
        }
    }

    fn open(&mut self, bufs: &mut [Vec<u8>]) {
        for b in bufs.iter_mut() {
            self.rx.open_in_place(b).expect("open");
        }
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Op {
    Seal,
    Open,
}

struct Config {
    library: &'static str,
    cipher: Cipher,
    size: usize,
    op: Op,
    subject: Box<dyn Subject>,
    bufs: Vec<Vec<u8>>,
    gbps: Vec<f64>,
    on_cpu_gbps: Vec<f64>,
}

/// Nanoseconds this thread has run on a CPU (0 where schedstat is missing).
fn on_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

impl Config {
    /// One run: whole batches until `secs` of timed work; returns GB/s of plaintext by the
    /// wall clock and by the time on a CPU (the timed share of the run's CPU time taken as
    /// its share of the run's wall time: descheduling hits both parts alike).
    fn run(&mut self, secs: Duration) -> (f64, f64) {
        let (mut timed, mut bytes) = (Duration::ZERO, 0u64);
        let (start, cpu0) = (Instant::now(), on_cpu_ns());
        while timed < secs {
            match self.op {
                Op::Seal => {
                    let t = Instant::now();
                    self.subject.seal(&mut self.bufs);
                    timed += t.elapsed();
                    // Open too (untimed): the next seal's input is plaintext again.
                    self.subject.open(&mut self.bufs);
                }
                Op::Open => {
                    self.subject.seal(&mut self.bufs);
                    let t = Instant::now();
                    self.subject.open(&mut self.bufs);
                    timed += t.elapsed();
                }
            }
            bytes += (self.size * self.bufs.len()) as u64;
        }
        let wall = start.elapsed().as_secs_f64();
        let cpu = on_cpu_ns().saturating_sub(cpu0) as f64 / 1e9;
        let gbps = bytes as f64 / timed.as_secs_f64() / 1e9;
        let on_cpu = if cpu > 0.0 {
            bytes as f64 / (timed.as_secs_f64() * (cpu / wall).min(1.0)) / 1e9
        } else {
            f64::NAN
        };
        (gbps, on_cpu)
    }
}

fn median_spread(v: &[f64]) -> (f64, f64, f64) {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let mid = if s.len() % 2 == 1 {
        s[s.len() / 2]
    } else {
        (s[s.len() / 2 - 1] + s[s.len() / 2]) / 2.0
    };
    (mid, s[0], s[s.len() - 1])
}

struct Args {
    runs: usize,
    secs: f64,
    sizes: Vec<usize>,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        runs: 7,
        secs: 0.25,
        sizes: vec![1400, 9000],
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let v = it.next().ok_or(format!("{k} needs a value"))?;
        match k.as_str() {
            "--runs" => a.runs = v.parse().map_err(|e| format!("--runs: {e}"))?,
            "--secs" => a.secs = v.parse().map_err(|e| format!("--secs: {e}"))?,
            "--sizes" => {
                a.sizes = v
                    .split(',')
                    .map(|s| s.parse().map_err(|e| format!("--sizes: {e}")))
                    .collect::<Result<_, _>>()?
            }
            _ => return Err(format!("unknown option {k}")),
        }
    }
    if a.runs == 0 || a.sizes.iter().any(|&s| s == 0 || s > 65000) {
        return Err("--runs must be at least 1 and sizes 1..65000".into());
    }
    Ok(a)
}

fn cpu_flags() -> String {
    #[cfg(target_arch = "x86_64")]
    {
        let mut f = vec![];
        macro_rules! flag {
            ($($n:tt),*) => {$( if std::is_x86_feature_detected!($n) { f.push($n) } )*};
        }
        flag!(
            "aes",
            "pclmulqdq",
            "avx",
            "avx2",
            "vaes",
            "vpclmulqdq",
            "avx512f",
            "avx512vl"
        );
        f.join(" ")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        String::from("(not x86_64)")
    }
}

fn main() {
    let a = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("aead_bench: {e}");
            std::process::exit(2);
        }
    };
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_default();
    println!("CPU: {cpu}; features: {}", cpu_flags());
    println!("fast here (offered in handshakes): {:?}", Ciphers::detect());
    println!(
        "{} runs of >= {} s each, interleaved; load average at start: {}",
        a.runs,
        a.secs,
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    type Make = fn(Cipher) -> Box<dyn Subject>;
    #[allow(unused_mut)] // only the aws-lc-rs comparison adds to it
    let mut libraries: Vec<(&'static str, Make)> = vec![
        ("ring 0.17", |c| Box::new(Ring::new(c))),
        ("vnet Session (ring)", |c| Box::new(Sessions::new(c))),
        ("snow 0.9 (RustCrypto)", |c| Box::new(Snow::new(c))),
    ];
    #[cfg(feature = "bench-aws-lc")]
    libraries.insert(1, ("aws-lc-rs 1", |c| Box::new(AwsLc::new(c))));
    let mut configs = vec![];
    for &(library, make) in &libraries {
        for cipher in [Cipher::Aes256Gcm, Cipher::ChaCha20Poly1305] {
            for &size in &a.sizes {
                for op in [Op::Seal, Op::Open] {
                    configs.push(Config {
                        library,
                        cipher,
                        size,
                        op,
                        subject: make(cipher),
                        bufs: vec![vec![0x5a; DATA_HEADER_LEN + size + TAG_LEN]; BATCH],
                        gbps: vec![],
                        on_cpu_gbps: vec![],
                    });
                }
            }
        }
    }
    let secs = Duration::from_secs_f64(a.secs);
    for c in &mut configs {
        c.run(secs / 5); // warm up: caches, CPU frequency
    }
    let (wall0, cpu0) = (Instant::now(), on_cpu_ns());
    for _ in 0..a.runs {
        for c in &mut configs {
            let (g, on_cpu) = c.run(secs);
            c.gbps.push(g);
            c.on_cpu_gbps.push(on_cpu);
        }
    }
    println!(
        "this thread was on a CPU {:.0} % of the measurement's {:.1} s",
        100.0 * on_cpu_ns().saturating_sub(cpu0) as f64 / 1e9 / wall0.elapsed().as_secs_f64(),
        wall0.elapsed().as_secs_f64()
    );
    let cell = |v: &[f64]| {
        let (m, lo, hi) = median_spread(v);
        format!("{m:.2} ({lo:.2}-{hi:.2})")
    };
    println!();
    println!(
        "| library | cipher | bytes | seal GB/s, wall | open GB/s, wall | seal GB/s, on CPU | open GB/s, on CPU |"
    );
    println!("| --- | --- | ---: | ---: | ---: | ---: | ---: |");
    for pair in configs.chunks(2) {
        let (s, o) = (&pair[0], &pair[1]);
        println!(
            "| {} | {} | {} | {} | {} | {} | {} |",
            s.library,
            s.cipher.name(),
            s.size,
            cell(&s.gbps),
            cell(&o.gbps),
            cell(&s.on_cpu_gbps),
            cell(&o.on_cpu_gbps),
        );
    }
    println!("(median of the runs, lowest-highest run in brackets)");
}
