//! Text from the control port or a config file: parsed, then validated against a configuration.
#![no_main]
use libfuzzer_sys::fuzz_target;
use vnet_control::{parse_script, Config};
use vnet_wire::MacAddr;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(cmds) = parse_script(text) else { return };
    let mut cfg = Config::default();
    let mut n = 0u8;
    let mut gen = || {
        n = n.wrapping_add(1);
        MacAddr([2, 0, 0, 0, 0, n])
    };
    for (_, c) in &cmds {
        let _ = cfg.apply(c, &mut gen);
    }
    // what the configuration prints, it must accept back
    let again = parse_script(&cfg.to_script()).expect("rendered config parses");
    let mut cfg2 = Config::default();
    for (_, c) in &again {
        cfg2.apply(c, &mut gen).expect("rendered config applies");
    }
    assert_eq!(cfg, cfg2);
});
