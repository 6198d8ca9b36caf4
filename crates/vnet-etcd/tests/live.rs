//! Against a real etcd (Debian's `/usr/bin/etcd`, started here on free loopback ports with its
//! own data directory, killed at the end), directly and through etcd's gRPC proxy (`etcd
//! grpc-proxy start`, from the same binary). Skipped, with a message, when etcd is not
//! installed.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use vnet_etcd::{Client, ClientConfig, Compare, CompareTarget, EventKind, TxnOp, WatchMessage};

struct Etcd {
    child: Child,
    dir: std::path::PathBuf,
    endpoint: String,
    /// Its gRPC proxy, when one was started (killed first).
    proxy: Option<(Child, String)>,
}

impl Drop for Etcd {
    fn drop(&mut self) {
        if let Some((p, _)) = &mut self.proxy {
            let _ = p.kill();
            let _ = p.wait();
        }
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
    start_etcd_with(&[])
}

/// etcd with `extra` arguments.
fn start_etcd_with(extra: &[&str]) -> Option<Etcd> {
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
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start etcd");
    let etcd = Etcd {
        child,
        dir,
        endpoint,
        proxy: None,
    };
    wait_up(&etcd.endpoint);
    Some(etcd)
}

/// Waits until a range at `endpoint` is answered (or an error answer: etcd with
/// authentication on refuses one without a user).
fn wait_up(endpoint: &str) {
    let client = Client::new(&ClientConfig::new(endpoint)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while client.range(b"/", None).is_err_and(|e| e.is_unreachable()) {
        assert!(Instant::now() < deadline, "{endpoint} did not come up");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// etcd with its gRPC proxy in front; the proxy's endpoint is the second.
fn start_etcd_and_proxy() -> Option<(Etcd, String)> {
    let mut etcd = start_etcd()?;
    let listen = format!("127.0.0.1:{}", free_port());
    let proxy = Command::new("/usr/bin/etcd")
        .args(["grpc-proxy", "start", "--endpoints", &etcd.endpoint])
        .args(["--listen-addr", &listen, "--advertise-client-url", &listen])
        .arg("--data-dir")
        .arg(etcd.dir.join("proxy"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start etcd grpc-proxy");
    etcd.proxy = Some((proxy, listen.clone()));
    wait_up(&listen);
    Some((etcd, listen))
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
    everything(&client);
}

/// The same through etcd's gRPC proxy (which serves no JSON gateway): it answers keep-alives
/// only on streams its client keeps open, and coalesces watches.
#[test]
fn kv_txn_lease_watch_through_the_grpc_proxy() {
    let Some((_etcd, proxy)) = start_etcd_and_proxy() else {
        return;
    };
    let client = Client::new(&ClientConfig::new(&proxy)).unwrap();
    everything(&client);
    // Keep-alives one after another, as the agent's thread sends them, each answered.
    let (lease, _) = client.lease_grant(5).unwrap();
    for _ in 0..3 {
        let ttl = client
            .lease_keepalive_within(lease, Duration::from_secs(3))
            .unwrap();
        assert!(ttl > 0, "lease renewed through the proxy: ttl {ttl}");
    }
    assert!(
        client
            .lease_keepalive_via(lease, 0, Duration::from_secs(3))
            .unwrap()
            > 0
    );
}

/// Snapshots read in pages through etcd's gRPC proxy: an agent's read after another's is the
/// proxy's cached answer (a write straight to etcd, which the proxy does not see, is not in
/// it) unless that is older than the floor the agent asks for; then a current one, which the
/// proxy serves from then on. Straight to etcd, a snapshot is current; a count is too.
#[test]
fn snapshots_through_the_grpc_proxy_come_from_its_cache_within_a_floor() {
    let Some((etcd, proxy)) = start_etcd_and_proxy() else {
        return;
    };
    let direct = Client::new(&ClientConfig::new(&etcd.endpoint)).unwrap();
    let via = Client::new(&ClientConfig::new(&proxy)).unwrap();
    for k in ["/s/a0", "/s/a1", "/s/a2", "/s/a3", "/s/a4", "/s/m", "/s/z"] {
        direct.put(k.as_bytes(), b"v", 0).unwrap();
    }
    // Everything under /s/ but /s/m (as the agent leaves out the traffic matrices).
    let ranges = vec![
        (b"/s/".to_vec(), Some(b"/s/m".to_vec())),
        (b"/s/m\0".to_vec(), Some(b"/s0".to_vec())),
    ];
    let keys = |r: &vnet_etcd::RangeResponse| {
        r.kvs
            .iter()
            .map(|kv| String::from_utf8_lossy(&kv.key).into_owned())
            .collect::<Vec<_>>()
    };
    let want: Vec<String> = ["/s/a0", "/s/a1", "/s/a2", "/s/a3", "/s/a4", "/s/z"]
        .map(String::from)
        .to_vec();
    // Pages of 2 keys: three pages of the first range at one revision, then the second range.
    let first = via.snapshot_paged(&ranges, 2, 0).unwrap();
    assert_eq!(keys(&first), want);
    assert_eq!(first.count, 6);
    assert!(first.bytes > 0);

    let rev = direct.put(b"/s/a9", b"v", 0).unwrap();
    let cached = via.snapshot_paged(&ranges, 2, first.revision).unwrap();
    assert_eq!(
        cached.revision, first.revision,
        "not the proxy's cached snapshot"
    );
    assert_eq!(keys(&cached), want);

    let fresh = via.snapshot_paged(&ranges, 2, rev).unwrap();
    assert!(fresh.revision >= rev);
    assert!(keys(&fresh).contains(&"/s/a9".to_string()));
    // The stale first page, then the current pages: more read than the snapshot holds.
    assert!(fresh.bytes > cached.bytes);
    let again = via.snapshot_paged(&ranges, 2, 0).unwrap();
    assert_eq!(
        again.revision, fresh.revision,
        "the proxy kept the stale snapshot"
    );

    let straight = direct.snapshot_paged(&ranges, 2, 0).unwrap();
    assert_eq!(straight.revision, rev);
    assert_eq!(keys(&straight), keys(&fresh));
    let count = direct.count(b"/s/", Some(b"/s0")).unwrap();
    assert_eq!((count.count, count.revision, count.kvs.len()), (8, rev, 0));
    // A paged read of a prefix: every key, at one revision.
    let paged = via.get_prefix_paged(b"/s/", 3).unwrap();
    assert_eq!((paged.kvs.len(), paged.count, paged.revision), (8, 8, rev));
}

/// etcd's auth tokens expire (here after 1 s): a call with an expired token gets a fresh one
/// and is answered; a wrong password is refused with etcd's message.
#[test]
fn expired_tokens_are_renewed() {
    let Some(etcd) = start_etcd_with_root() else {
        return;
    };
    let mut cfg = ClientConfig::new(&etcd.endpoint);
    cfg.user = Some(("root".into(), "rootpw".into()));
    let client = Client::new(&cfg).unwrap();
    client.put(b"/a", b"1", 0).unwrap();
    // Simple tokens expire after the TTL without use (etcd checks every second or so).
    std::thread::sleep(Duration::from_secs(4));
    client.put(b"/a", b"2", 0).unwrap();
    assert_eq!(client.range(b"/a", None).unwrap().kvs[0].value, b"2");
    // Without a user etcd refuses; with a wrong password too, saying why.
    assert!(Client::new(&ClientConfig::new(&etcd.endpoint))
        .unwrap()
        .put(b"/a", b"3", 0)
        .is_err());
    cfg.user = Some(("root".into(), "nope".into()));
    let e = Client::new(&cfg).unwrap().range(b"/a", None).unwrap_err();
    assert!(e.to_string().contains("authentication failed"), "{e}");
}

/// etcd with authentication on, for the user root (password rootpw), and auth tokens that
/// expire after 1 s unused; None (skipped, with a message) without etcd or etcdctl.
fn start_etcd_with_root() -> Option<Etcd> {
    if !std::path::Path::new("/usr/bin/etcdctl").exists() {
        eprintln!("skipped: /usr/bin/etcdctl is not installed (scripts/setup.sh installs it)");
        return None;
    }
    let etcd = start_etcd_with(&["--auth-token", "simple", "--auth-token-ttl", "1"])?;
    enable_root(&etcd);
    Some(etcd)
}

/// Adds the user root (password rootpw) and enables authentication, with etcdctl.
fn enable_root(etcd: &Etcd) {
    for args in [
        &["user", "add", "root:rootpw", "--interactive=false"][..],
        &["auth", "enable"][..],
    ] {
        let out = Command::new("/usr/bin/etcdctl")
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", &etcd.endpoint])
            .args(args)
            .output()
            .expect("run etcdctl");
        assert!(out.status.success(), "etcdctl {args:?}: {out:?}");
    }
}

/// Ranges, a watch, a transaction, a lease's life, through `client`.
fn everything(client: &Client) {
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

/// The sum of the samples of `metric` on etcd's `/metrics` whose labels contain `labels`.
fn etcd_metric(endpoint: &str, metric: &str, labels: &str) -> u64 {
    use std::io::{Read, Write};
    let addr = endpoint.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr).expect("connect to etcd's /metrics");
    write!(s, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").expect("ask /metrics");
    let mut page = String::new();
    s.read_to_string(&mut page).expect("read /metrics");
    page.lines()
        .filter(|l| {
            l.strip_prefix(metric)
                .is_some_and(|rest| rest.starts_with([' ', '{']) && rest.contains(labels))
        })
        .filter_map(|l| l.rsplit(' ').next()?.trim().parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// etcd's count of its watchers.
fn etcd_watchers(endpoint: &str) -> u64 {
    etcd_metric(endpoint, "etcd_debugging_mvcc_watcher_total", "")
}

/// The keep-alive streams open on etcd: begun and not yet ended.
fn open_keepalive_streams(endpoint: &str) -> u64 {
    let method = "grpc_method=\"LeaseKeepAlive\"";
    let started = etcd_metric(endpoint, "grpc_server_started_total", method);
    let handled = etcd_metric(endpoint, "grpc_server_handled_total", method);
    started.saturating_sub(handled)
}

/// Waits up to 5 s for etcd to hold `want` watchers; what it holds at the end. Meanwhile
/// `client` reads a key now and then: its runtime runs only inside a call (as in the agent,
/// whose watch readers are always in one), and the stream's end is sent from there.
fn wait_watchers(endpoint: &str, client: &Client, want: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let n = etcd_watchers(endpoint);
        if n == want || Instant::now() > deadline {
            return n;
        }
        let _ = client.range(b"/x", None);
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A dropped watch ends at once, although nothing happened on its keys: on etcd, and on etcd's
/// gRPC proxy (whose shared watch on etcd then ends too). The agent drops the watch a session
/// no longer reads, and moves its lasting watch once (vnet-agent's regroup); a watch left open
/// would keep receiving and keep the proxy's old shared watch alive.
#[test]
fn a_dropped_watch_ends_on_etcd_and_on_the_proxy() {
    let Some((etcd, proxy)) = start_etcd_and_proxy() else {
        return;
    };
    let idle = etcd_watchers(&etcd.endpoint);
    for endpoint in [etcd.endpoint.clone(), proxy] {
        let client = Client::new(&ClientConfig::new(&endpoint)).unwrap();
        let ranges = [
            (b"/a/".to_vec(), Some(b"/a0".to_vec())),
            (b"/b/".to_vec(), Some(b"/b0".to_vec())),
        ];
        let mut watch = client.watch_ranges(&ranges, 0).unwrap();
        for _ in &ranges {
            assert!(matches!(
                watch.next_message(),
                Ok(WatchMessage::Created { .. })
            ));
        }
        let open = wait_watchers(&etcd.endpoint, &client, idle + 2);
        assert_eq!(open, idle + 2, "{endpoint}: open");
        drop(watch);
        let dropped = wait_watchers(&etcd.endpoint, &client, idle);
        assert_eq!(dropped, idle, "{endpoint}: dropped");
    }
}

/// A renewal's stream stays open only until the next renewal is answered (they used to stay
/// open for as long as the connection: one more stream on etcd, or on its proxy, every TTL/3
/// per host).
#[test]
fn keepalives_leave_one_stream_open() {
    let Some(etcd) = start_etcd() else { return };
    let client = Client::new(&ClientConfig::new(&etcd.endpoint)).unwrap();
    let (lease, _) = client.lease_grant(30).unwrap();
    for _ in 0..5 {
        assert!(client.lease_keepalive(lease).unwrap() > 0);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while open_keepalive_streams(&etcd.endpoint) > 1 && Instant::now() < deadline {
        let _ = client.range(b"/x", None); // drives the client's runtime (see wait_watchers)
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        open_keepalive_streams(&etcd.endpoint),
        1,
        "the last renewal's"
    );
    drop(client);
    let deadline = Instant::now() + Duration::from_secs(5);
    while open_keepalive_streams(&etcd.endpoint) > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        open_keepalive_streams(&etcd.endpoint),
        0,
        "none once the client is gone"
    );
}

/// This process's established TCP connections to `port` on loopback (from /proc/net/tcp).
fn connections_to(port: u16) -> usize {
    let tcp = std::fs::read_to_string("/proc/self/net/tcp").expect("read /proc/self/net/tcp");
    let remote = format!("0100007F:{port:04X}");
    tcp.lines()
        .skip(1)
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.get(2) == Some(&remote.as_str()) && f.get(3) == Some(&"01")
        })
        .count()
}

/// A client made by `with_own_connection` calls over a connection of its own (so that its
/// small calls, an agent's renewals, never queue behind the first client's big answers), with
/// the first one's credentials: its token serves it until it expires, then it gets its own.
#[test]
fn a_client_with_its_own_connection() {
    let Some(etcd) = start_etcd_with_root() else {
        return;
    };
    let port: u16 = etcd
        .endpoint
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("etcd's port");
    let mut cfg = ClientConfig::new(&etcd.endpoint);
    cfg.user = Some(("root".into(), "rootpw".into()));
    let first = Client::new(&cfg).unwrap();
    first.put(b"/own/a", b"1", 0).unwrap();
    let before = connections_to(port);
    let own = first.with_own_connection().unwrap();
    assert_eq!(own.endpoints(), first.endpoints());
    let (lease, _) = own.lease_grant(30).unwrap();
    assert!(own.lease_keepalive(lease).unwrap() > 0);
    assert_eq!(own.range(b"/own/a", None).unwrap().kvs[0].value, b"1");
    assert_eq!(
        connections_to(port),
        before + 1,
        "one more connection to etcd, the new client's"
    );
    // Both keep working, each on its own, after the token they shared has expired.
    std::thread::sleep(Duration::from_secs(4));
    assert!(own.lease_keepalive(lease).unwrap() > 0);
    first.put(b"/own/a", b"2", 0).unwrap();
    assert_eq!(own.range(b"/own/a", None).unwrap().kvs[0].value, b"2");
}
