//! Watch events from etcd, as hostile as a writer of the overlay's prefix can make them: keys
//! and values are arbitrary bytes, fed to the cluster state as puts and deletes, and after each
//! the host's links and routes are derived. Nothing may panic; every derived command must be
//! one the local configuration accepts.
#![no_main]
use libfuzzer_sys::fuzz_target;
use vnet_cluster::{derive, ClusterState};
use vnet_control::{parse_script, Config};
use vnet_wire::MacAddr;

const KEYS: [&str; 6] = [
    "/vnet/lab/hosts/",
    "/vnet/lab/interfaces/1/",
    "/vnet/lab/routes/",
    "/vnet/lab/policy",
    "/vnet/lab/matrix/",
    "/vnet/other/hosts/",
];

fuzz_target!(|data: &[u8]| {
    let Ok(overlay) = "lab".parse() else { return };
    let Ok(me) = "a".parse() else { return };
    let mut local = Config::default();
    if let Ok(script) = parse_script("interface add vm tap mac 52:54:00:00:0a:01 vni 1\n") {
        for (_, cmd) in script {
            let _ = local.apply(&cmd, &mut || MacAddr([2, 0, 0, 0, 0, 1]));
        }
    }
    let mut state = ClusterState::new(overlay);
    // Records: [kind, key-suffix length, value length, key suffix, value]...
    let mut rest = data;
    while rest.len() >= 3 {
        let (kind, klen, vlen) = (rest[0], rest[1] as usize % 32, rest[2] as usize);
        rest = &rest[3..];
        let klen = klen.min(rest.len());
        let suffix = String::from_utf8_lossy(&rest[..klen]).into_owned();
        rest = &rest[klen..];
        let vlen = vlen.min(rest.len());
        let value = &rest[..vlen];
        rest = &rest[vlen..];
        let key = format!("{}{}", KEYS[(kind as usize >> 1) % KEYS.len()], suffix);
        let _ = if kind & 1 == 0 {
            state.apply_put(&key, value)
        } else {
            state.apply_delete(&key)
        };
        let d = derive(&me, &state, &local);
        let mut running = local.clone();
        for cmd in d.config.commands() {
            if let Err(e) = running.apply(&cmd, &mut || MacAddr([2, 0, 0, 0, 0, 2])) {
                panic!("derived a command the configuration refuses: {e}");
            }
        }
    }
});
