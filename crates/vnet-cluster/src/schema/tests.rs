//! Keys and records against the schema: round trips, every refusal, and no panic on any input.

use super::*;
use proptest::prelude::*;
use vnet_wire::MacAddr;

fn o() -> OverlayName {
    "lab".parse().unwrap()
}

fn h(s: &str) -> HostId {
    s.parse().unwrap()
}

fn mac(s: &str) -> MacAddr {
    s.parse().unwrap()
}

fn host(id: &str) -> HostRecord {
    HostRecord {
        host_id: h(id),
        addr: "10.0.0.1".parse().unwrap(),
        udp_port: 4789,
        tcp_port: Some(7000),
        capabilities: vec!["vxlan".into(), "tcp".into()],
        public_key: Some("q83vEjRWeJq83vEjRWeJq83vEjRWeJq83vEjRWeJq80=".into()),
        version: SCHEMA_VERSION,
        reach: Default::default(),
    }
}

fn iface() -> InterfaceRecord {
    InterfaceRecord {
        mac: mac("52:54:00:00:0a:01"),
        vni: 7,
        host_id: h("a"),
        name: "vm-a1".into(),
        epoch: 3,
    }
}

#[test]
fn names() {
    assert!("host-1.dc_2".parse::<HostId>().is_ok());
    for bad in ["", ".", "..", "a/b", "a b", "ä", &"x".repeat(21)] {
        assert!(bad.parse::<HostId>().is_err(), "{bad}");
    }
    assert!("x".repeat(32).parse::<OverlayName>().is_ok());
    assert!("x".repeat(33).parse::<OverlayName>().is_err());
    assert!(serde_json::from_str::<HostId>("\"a/b\"").is_err());
    assert_eq!(serde_json::to_string(&h("a")).unwrap(), "\"a\"");
}

#[test]
fn keys_round_trip() {
    let o = o();
    assert_eq!(overlay_prefix(&o), "/vnet/lab/");
    let m = mac("52:54:00:00:0a:01");
    for k in [
        ClusterKey::Host(h("a")),
        ClusterKey::Interface { vni: 7, mac: m },
        ClusterKey::Route("r1".parse().unwrap()),
        ClusterKey::Policy,
    ] {
        assert_eq!(parse_key(&o, &k.to_key(&o)).unwrap(), k);
    }
    assert_eq!(
        key_for_interface(&o, 7, m),
        "/vnet/lab/interfaces/7/52:54:00:00:0a:01"
    );
    assert_eq!(key_for_host(&o, &h("a")), "/vnet/lab/hosts/a");
    assert!(key_for_host(&o, &h("a")).starts_with(&hosts_prefix(&o)));
    assert_eq!(key_for_policy(&o), "/vnet/lab/policy");
}

#[test]
fn bad_keys() {
    let o = o();
    assert!(matches!(
        parse_key(&o, "/vnet/other/hosts/a"),
        Err(SchemaError::NotInOverlay(_))
    ));
    for k in [
        "/vnet/lab/",
        "/vnet/lab/hosts",
        "/vnet/lab/hosts/",
        "/vnet/lab/hosts/a/b",
        "/vnet/lab/interfaces/7",
        "/vnet/lab/interfaces/07/52:54:00:00:0a:01",
        "/vnet/lab/interfaces/0/52:54:00:00:0a:01",
        "/vnet/lab/interfaces/16777216/52:54:00:00:0a:01",
        "/vnet/lab/interfaces/7/52:54:00:00:0A:01",
        "/vnet/lab/interfaces/7/52-54-00-00-0a-01",
        "/vnet/lab/interfaces/x/52:54:00:00:0a:01",
        "/vnet/lab/policy/x",
        "/vnet/lab/routes/a b",
        "/vnet/lab/leases/a",
    ] {
        assert!(parse_key(&o, k).is_err(), "{k}");
    }
    assert!(parse_key(&o, &format!("/vnet/lab/hosts/{}", "a".repeat(600))).is_err());
}

#[test]
fn host_records() {
    let o = o();
    let r = host("a");
    let v = encode(&r);
    assert_eq!(
        parse_entry(&o, "/vnet/lab/hosts/a", &v).unwrap(),
        ClusterEntry::Host(r.clone())
    );
    // unknown fields are ignored (a newer writer), missing optional ones default
    let newer = br#"{"host_id":"a","addr":"fd00::1","udp_port":4789,"version":2,"extra":[1]}"#;
    let ClusterEntry::Host(n) = parse_entry(&o, "/vnet/lab/hosts/a", newer).unwrap() else {
        panic!()
    };
    assert!(n.capabilities.is_empty() && n.tcp_port.is_none());
    assert!(matches!(
        parse_entry(&o, "/vnet/lab/hosts/b", &v),
        Err(SchemaError::KeyMismatch(_))
    ));
    let refuse = |f: &dyn Fn(&mut HostRecord)| {
        let mut r = host("a");
        f(&mut r);
        parse_entry(&o, "/vnet/lab/hosts/a", &encode(&r)).unwrap_err()
    };
    refuse(&|r| r.addr = "0.0.0.0".parse().unwrap());
    refuse(&|r| r.addr = "239.0.0.1".parse().unwrap());
    refuse(&|r| r.udp_port = 0);
    refuse(&|r| r.tcp_port = None);
    refuse(&|r| r.capabilities.push("Bad Cap".into()));
    refuse(&|r| r.public_key = Some("abc".into()));
    refuse(&|r| r.public_key = Some("ab=c".into()));
    assert!(parse_entry(&o, "/vnet/lab/hosts/a", b"{").is_err());
    assert!(parse_entry(&o, "/vnet/lab/hosts/a", b"null").is_err());
    assert!(matches!(
        parse_entry(&o, "/vnet/lab/hosts/a", &vec![b' '; MAX_VALUE_LEN + 1]),
        Err(SchemaError::ValueTooLarge { .. })
    ));
}

#[test]
fn interface_records() {
    let o = o();
    let r = iface();
    let key = key_for_interface(&o, 7, r.mac);
    assert_eq!(
        std::str::from_utf8(&encode(&r)).unwrap(),
        r#"{"mac":"52:54:00:00:0a:01","vni":7,"host_id":"a","name":"vm-a1","epoch":3}"#
    );
    assert_eq!(
        parse_entry(&o, &key, &encode(&r)).unwrap(),
        ClusterEntry::Interface(r.clone())
    );
    let other = key_for_interface(&o, 8, r.mac);
    assert!(matches!(
        parse_entry(&o, &other, &encode(&r)),
        Err(SchemaError::KeyMismatch(_))
    ));
    for f in [
        |r: &mut InterfaceRecord| r.mac = MacAddr::BROADCAST,
        |r: &mut InterfaceRecord| r.mac = MacAddr::ZERO,
        |r: &mut InterfaceRecord| r.name = "any".into(),
        |r: &mut InterfaceRecord| r.name = "a b".into(),
        |r: &mut InterfaceRecord| r.name = "a#".into(),
    ] {
        let mut bad = iface();
        f(&mut bad);
        let key = key_for_interface(&o, bad.vni, bad.mac);
        assert!(parse_entry(&o, &key, &encode(&bad)).is_err(), "{bad:?}");
    }
    let bad_mac = br#"{"mac":"zz","vni":7,"host_id":"a","name":"x","epoch":0}"#;
    assert!(parse_entry(&o, &key, bad_mac).is_err());
}

#[test]
fn migration_condition() {
    let o = o();
    let cur = iface();
    let mv = plan_move(&o, &cur, &h("b"), "vm-a1").unwrap();
    assert_eq!(mv.key, "/vnet/lab/interfaces/7/52:54:00:00:0a:01");
    assert_eq!(
        (mv.new_record.host_id.as_str(), mv.new_record.epoch),
        ("b", 4)
    );
    assert_eq!(mv.expected_value, encode(&cur));
    assert_eq!(mv.new_value, encode(&mv.new_record));
    assert!(mv.holds(Some(&cur)));
    assert!(!mv.holds(None));
    assert!(!mv.holds(Some(&mv.new_record)));
    let raced = InterfaceRecord {
        epoch: 4,
        ..cur.clone()
    };
    assert!(!mv.holds(Some(&raced)));
    let spent = InterfaceRecord {
        epoch: u64::MAX,
        ..cur.clone()
    };
    assert!(plan_move(&o, &spent, &h("b"), "x").is_err());
    assert!(plan_move(&o, &cur, &h("b"), "not a name").is_err());
}

#[test]
fn routes_and_policy() {
    let o = o();
    let v = br#"{"line":"route add any 52:54:00:00:0b:01 link c-b-v1","host_id":"a"}"#;
    let ClusterEntry::Route(r) = parse_entry(&o, "/vnet/lab/routes/r1", v).unwrap() else {
        panic!()
    };
    assert!(r.applies_to(&h("a")) && !r.applies_to(&h("b")));
    let again = parse_entry(
        &o,
        "/vnet/lab/routes/r1",
        &ClusterEntry::Route(r.clone()).value(),
    );
    assert_eq!(again.unwrap(), ClusterEntry::Route(r));
    for bad in [
        r#"{"line":"route del any any link x"}"#,
        r#"{"line":"link add x udp 10.0.0.1"}"#,
        r#"{"line":"route add any any link"}"#,
        r#"{"line":""}"#,
        r#"{"line":"route add any any link x","host_id":"a/b"}"#,
    ] {
        assert!(
            parse_entry(&o, "/vnet/lab/routes/r1", bad.as_bytes()).is_err(),
            "{bad}"
        );
    }
    let p = |s: &str| parse_entry(&o, "/vnet/lab/policy", s.as_bytes());
    assert_eq!(
        p(r#"{"template":"mesh"}"#).unwrap(),
        ClusterEntry::Policy(Policy::Mesh)
    );
    assert_eq!(
        p(r#"{"template":"star","proxy":"hub"}"#).unwrap(),
        ClusterEntry::Policy(Policy::Star { proxy: h("hub") })
    );
    assert_eq!(
        p(r#"{"template":"explicit"}"#).unwrap(),
        ClusterEntry::Policy(Policy::Explicit)
    );
    assert!(p(r#"{"template":"ring"}"#).is_err());
    assert!(p(r#"{"template":"star"}"#).is_err());
    assert_eq!(
        encode(&Policy::Star { proxy: h("hub") }),
        br#"{"template":"star","proxy":"hub"}"#
    );
}

proptest! {
    #[test]
    fn parse_key_never_panics(k in ".{0,80}", tail in "[a-z0-9:/._-]{0,40}") {
        let o = o();
        let _ = parse_key(&o, &k);
        let _ = parse_key(&o, &format!("/vnet/lab/{tail}"));
        let _ = parse_key(&o, &format!("/vnet/lab/interfaces/{tail}"));
    }

    #[test]
    fn parse_entry_never_panics(
        which in 0usize..4,
        value in proptest::collection::vec(any::<u8>(), 0..200),
        text in ".{0,120}",
    ) {
        let o = o();
        let key = [
            "/vnet/lab/hosts/a",
            "/vnet/lab/interfaces/7/52:54:00:00:0a:01",
            "/vnet/lab/routes/r1",
            "/vnet/lab/policy",
        ][which];
        let _ = parse_entry(&o, key, &value);
        let _ = parse_entry(&o, key, text.as_bytes());
        let line = serde_json::json!({ "line": text }).to_string();
        let _ = parse_entry(&o, "/vnet/lab/routes/r1", line.as_bytes());
    }
}
