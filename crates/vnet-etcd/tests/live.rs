//! Against a real etcd (Debian's `/usr/bin/etcd`, started here on free loopback ports with its
//! own data directory, killed at the end). Skipped, with a message, when etcd is not installed.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use vnet_etcd::{Client, ClientConfig, Compare, CompareTarget, EventKind, TxnOp, WatchMessage};

struct Etcd {
    child: Child,
    dir: std::path::PathBuf,
    endpoint: String,
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

fn start_etcd() -> Option<Etcd> {
    if !std::path::Path::new("/usr/bin/etcd").exists() {
        eprintln!("skipped: /usr/bin/etcd is not installed (scripts/setup.sh installs it)");
        return None;
    }
    let (client, peer) = (free_port(), free_port());
    let dir = std::env::temp_dir().join(format!("vnet-etcd-test-{}-{client}", std::process::id()));
    let endpoint = format!("http://127.0.0.1:{client}");
    let child = Command::new("/usr/bin/etcd")
        .args(["--name", "t", "--data-dir"])
        .arg(&dir)
        .args([
            "--listen-client-urls",
            &endpoint,
            "--advertise-client-urls",
            &endpoint,
        ])
        .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer}")])
        .args([
            "--initial-advertise-peer-urls",
            &format!("http://127.0.0.1:{peer}"),
        ])
        .args(["--initial-cluster", &format!("t=http://127.0.0.1:{peer}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start etcd");
    let etcd = Etcd {
        child,
        dir,
        endpoint,
    };
    let client = Client::new(&ClientConfig::new(&etcd.endpoint)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while client.range(b"/", None).is_err() {
        assert!(Instant::now() < deadline, "etcd did not come up");
        std::thread::sleep(Duration::from_millis(100));
    }
    Some(etcd)
}

#[test]
fn kv_txn_lease_watch() {
    let Some(etcd) = start_etcd() else { return };
    // A dead endpoint first: the client must fail over to the live one.
    let client = Client::new(&ClientConfig::new(&format!(
        "127.0.0.1:1,{}",
        etcd.endpoint
    )))
    .unwrap();
    let rev = client.put(b"/t/a", b"1", 0).unwrap();
    assert!(rev > 0);
    let r = client.get_prefix(b"/t/").unwrap();
    assert_eq!(r.kvs.len(), 1);
    assert_eq!(r.kvs[0].value, b"1");

    let mut watch = client
        .watch(b"/t/", Some(&vnet_etcd::prefix_end(b"/t/")), r.revision + 1)
        .unwrap();
    assert!(matches!(
        watch.next_message().unwrap(),
        WatchMessage::Created { .. }
    ));

    // A transaction conditioned on the value: the first holds, the second does not.
    let cmp = [Compare {
        key: b"/t/a".to_vec(),
        target: CompareTarget::Value(b"1".to_vec()),
    }];
    let put = [TxnOp::Put {
        key: b"/t/a".to_vec(),
        value: b"2".to_vec(),
        lease: 0,
    }];
    assert!(client.txn(&cmp, &put, &[]).unwrap());
    assert!(!client.txn(&cmp, &put, &[]).unwrap());

    let (lease, ttl) = client.lease_grant(2).unwrap();
    assert!(ttl >= 1);
    client.put(b"/t/leased", b"x", lease).unwrap();
    assert!(client.lease_keepalive(lease).unwrap() > 0);
    client.lease_revoke(lease).unwrap();
    assert!(client.lease_keepalive(lease).unwrap() <= 0);
    client.delete(b"/t/a", None).unwrap();

    let mut seen = Vec::new();
    while seen.len() < 4 {
        match watch.next_message().unwrap() {
            WatchMessage::Events { events, .. } => {
                seen.extend(events.into_iter().map(|e| (e.kind, e.kv.key, e.kv.value)))
            }
            m => panic!("unexpected {m:?}"),
        }
    }
    assert_eq!(seen[0], (EventKind::Put, b"/t/a".to_vec(), b"2".to_vec()));
    assert_eq!(
        seen[1],
        (EventKind::Put, b"/t/leased".to_vec(), b"x".to_vec())
    );
    assert_eq!(seen[2].0, EventKind::Delete);
    assert_eq!(seen[2].1, b"/t/leased".to_vec());
    assert_eq!(
        (seen[3].0, seen[3].1.as_slice()),
        (EventKind::Delete, &b"/t/a"[..])
    );

    // An error answer is an error, not a panic: a lease that does not exist.
    assert!(client.put(b"/t/b", b"x", 12345).is_err());
}
