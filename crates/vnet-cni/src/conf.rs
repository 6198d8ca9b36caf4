//! The CNI side of the plugin (pure): the network configuration, the runtime's environment,
//! the results and the errors, in the shapes of the CNI specification 1.0/1.1.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use thiserror::Error;
use vnet_wire::MacAddr;

/// The CNI versions this plugin speaks (the result format is the same in both).
pub const SUPPORTED_VERSIONS: [&str; 2] = ["1.0.0", "1.1.0"];
/// vnetd's default control address.
pub const DEFAULT_CONTROL: &str = "127.0.0.1:7600";
/// The largest network configuration read from stdin.
pub const MAX_CONFIG_BYTES: usize = 1 << 20;

/// An error in the CNI error format (`code`, `msg`, `details`).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{msg}: {details}")]
pub struct CniError {
    pub code: u32,
    pub msg: String,
    pub details: String,
}

/// Error codes of the specification, and this plugin's own (100 and up).
pub mod code {
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    pub const INVALID_ENV: u32 = 4;
    pub const IO: u32 = 5;
    pub const DECODING: u32 = 6;
    pub const INVALID_CONFIG: u32 = 7;
    pub const TRY_AGAIN: u32 = 11;
    pub const NOT_AVAILABLE: u32 = 50;
    /// vnetd refused a command.
    pub const VNETD_REFUSED: u32 = 100;
    /// The container's interface is not as the previous result says (CHECK).
    pub const CHECK_FAILED: u32 = 101;
    /// A kernel operation on the interface failed.
    pub const NETLINK: u32 = 102;
    /// The IPAM plugin failed (its own error is in `details`).
    pub const IPAM: u32 = 103;
}

impl CniError {
    pub fn new(code: u32, msg: impl Into<String>, details: impl Into<String>) -> CniError {
        CniError {
            code,
            msg: msg.into(),
            details: details.into(),
        }
    }

    /// The JSON the runtime reads from stdout.
    pub fn to_json(&self, cni_version: &str) -> Value {
        serde_json::json!({
            "cniVersion": cni_version,
            "code": self.code,
            "msg": self.msg,
            "details": self.details,
        })
    }
}

/// The network configuration (stdin), with this plugin's keys.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetConf {
    pub cni_version: String,
    pub name: String,
    #[serde(rename = "type")]
    pub plugin_type: String,
    /// The overlay's VNI (default 1).
    pub vni: Option<u32>,
    /// The interface's MTU (default: vnetd's, 1500).
    pub mtu: Option<u32>,
    /// vnetd's control address (default 127.0.0.1:7600).
    pub control: Option<String>,
    /// The control port's token file (default: `$VNET_TOKEN_FILE`, else `/etc/vnet/token`
    /// when it exists).
    pub token_file: Option<PathBuf>,
    /// vnetd's state directory (default /var/lib/vnet): where DEL leaves a deletion for a
    /// vnetd that is not running.
    pub state_dir: Option<PathBuf>,
    pub ipam: Option<Ipam>,
    pub prev_result: Option<Value>,
    pub runtime_config: Option<RuntimeConfig>,
    /// CNI 1.1 GC: the attachments that are still valid.
    #[serde(rename = "cni.dev/valid-attachments")]
    pub valid_attachments: Option<Vec<Attachment>>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Ipam {
    #[serde(rename = "type")]
    pub plugin_type: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct RuntimeConfig {
    /// The `mac` capability.
    pub mac: Option<String>,
}

#[derive(Debug, Clone, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "camelCase")]
pub struct Attachment {
    #[serde(rename = "containerID")]
    pub container_id: String,
    pub ifname: String,
}

/// A checked configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub raw: Value,
    pub conf: NetConf,
    pub vni: u32,
    pub control: SocketAddr,
}

fn invalid(details: impl Into<String>) -> CniError {
    CniError::new(
        code::INVALID_CONFIG,
        "invalid network configuration",
        details,
    )
}

/// Parses and checks the network configuration.
pub fn parse_config(bytes: &[u8]) -> Result<Config, CniError> {
    let raw: Value = serde_json::from_slice(bytes).map_err(|e| {
        CniError::new(
            code::DECODING,
            "network configuration is not JSON",
            e.to_string(),
        )
    })?;
    let conf: NetConf = serde_json::from_value(raw.clone()).map_err(|e| invalid(e.to_string()))?;
    if !SUPPORTED_VERSIONS.contains(&conf.cni_version.as_str()) {
        return Err(CniError::new(
            code::INCOMPATIBLE_VERSION,
            "incompatible CNI version",
            format!(
                "config has {}, vnet-cni speaks {}",
                conf.cni_version,
                SUPPORTED_VERSIONS.join(", ")
            ),
        ));
    }
    if conf.name.is_empty() {
        return Err(invalid("\"name\" is empty"));
    }
    if conf.plugin_type.is_empty() {
        return Err(invalid("\"type\" is empty"));
    }
    let vni = conf.vni.unwrap_or(1);
    if !(1..=0xff_ffff).contains(&vni) {
        return Err(invalid(format!("\"vni\" {vni} is not 1..16777215")));
    }
    if let Some(m) = conf.mtu {
        if !(68..=65535).contains(&m) {
            return Err(invalid(format!("\"mtu\" {m} is not 68..65535")));
        }
    }
    let control_text = conf.control.as_deref().unwrap_or(DEFAULT_CONTROL);
    let control = control_text
        .parse::<SocketAddr>()
        .map_err(|_| invalid(format!("\"control\" {control_text:?} is not IP:PORT")))?;
    Ok(Config {
        raw,
        conf,
        vni,
        control,
    })
}

/// What the runtime says in the environment.
#[derive(Debug, Clone)]
pub struct Env {
    pub command: String,
    pub container_id: Option<String>,
    pub netns: Option<PathBuf>,
    pub ifname: Option<String>,
    pub args: BTreeMap<String, String>,
    pub path: Vec<PathBuf>,
}

fn env_error(details: impl Into<String>) -> CniError {
    CniError::new(code::INVALID_ENV, "invalid CNI environment", details)
}

impl Env {
    /// From the variables (`get` is `std::env::var` outside tests).
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Env, CniError> {
        let command = get("CNI_COMMAND").ok_or_else(|| env_error("CNI_COMMAND is not set"))?;
        let mut args = BTreeMap::new();
        for kv in get("CNI_ARGS")
            .unwrap_or_default()
            .split(';')
            .filter(|s| !s.is_empty())
        {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| env_error(format!("CNI_ARGS item {kv:?} is not K=V")))?;
            args.insert(k.to_string(), v.to_string());
        }
        Ok(Env {
            command,
            container_id: get("CNI_CONTAINERID").filter(|s| !s.is_empty()),
            netns: get("CNI_NETNS")
                .filter(|s| !s.is_empty())
                .map(PathBuf::from),
            ifname: get("CNI_IFNAME").filter(|s| !s.is_empty()),
            args,
            path: get("CNI_PATH")
                .unwrap_or_default()
                .split(':')
                .filter(|s| !s.is_empty())
                .map(PathBuf::from)
                .collect(),
        })
    }

    pub fn require_container(&self) -> Result<(&str, &str), CniError> {
        let id = self
            .container_id
            .as_deref()
            .ok_or_else(|| env_error("CNI_CONTAINERID is not set"))?;
        let ifname = self
            .ifname
            .as_deref()
            .ok_or_else(|| env_error("CNI_IFNAME is not set"))?;
        if ifname.len() > 15
            || ifname.contains(['/', ':'])
            || ifname.chars().any(char::is_whitespace)
        {
            return Err(env_error(format!(
                "CNI_IFNAME {ifname:?} is not a device name"
            )));
        }
        Ok((id, ifname))
    }

    /// CNI_NETNS, which ADD and CHECK need.
    pub fn require_netns(&self) -> Result<PathBuf, CniError> {
        self.netns
            .clone()
            .ok_or_else(|| env_error("CNI_NETNS is not set"))
    }
}

/// The MAC the runtime asks for (the `mac` capability, or `MAC` in CNI_ARGS), if any.
pub fn requested_mac(conf: &NetConf, env: &Env) -> Result<Option<MacAddr>, CniError> {
    let text = conf
        .runtime_config
        .as_ref()
        .and_then(|r| r.mac.clone())
        .or_else(|| env.args.get("MAC").cloned());
    let Some(text) = text else {
        return Ok(None);
    };
    let mac: MacAddr = text
        .parse()
        .map_err(|_| invalid(format!("MAC {text:?} is not a MAC address")))?;
    if mac.is_multicast() {
        return Err(invalid(format!("MAC {mac} is not a unicast address")));
    }
    Ok(Some(mac))
}

/// An address with its prefix length (`10.1.0.5/24`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpNet {
    pub addr: IpAddr,
    pub prefix: u8,
}

impl std::str::FromStr for IpNet {
    type Err = String;
    fn from_str(s: &str) -> Result<IpNet, String> {
        let (a, p) = s
            .split_once('/')
            .ok_or_else(|| format!("{s:?} has no /prefix"))?;
        let addr: IpAddr = a
            .parse()
            .map_err(|_| format!("{a:?} is not an IP address"))?;
        let prefix: u8 = p
            .parse()
            .map_err(|_| format!("{p:?} is not a prefix length"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        if prefix > max {
            return Err(format!("prefix /{prefix} is longer than {max}"));
        }
        Ok(IpNet { addr, prefix })
    }
}

impl std::fmt::Display for IpNet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// The parts of an IPAM result this plugin uses (the rest, `dns`, is passed on as is).
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct IpamResult {
    #[serde(default)]
    pub ips: Vec<IpConfig>,
    #[serde(default)]
    pub routes: Vec<RouteConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns: Option<Value>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct IpConfig {
    pub address: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<usize>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct RouteConfig {
    pub dst: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gw: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct InterfaceResult {
    pub name: String,
    pub mac: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
}

/// The result of ADD (and the `prevResult` of CHECK and DEL).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AddResult {
    pub cni_version: String,
    #[serde(default)]
    pub interfaces: Vec<InterfaceResult>,
    #[serde(default)]
    pub ips: Vec<IpConfig>,
    #[serde(default)]
    pub routes: Vec<RouteConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns: Option<Value>,
}

/// The ADD result: the container's NIC first (index 0, which the addresses name), then the
/// host's end of its veth when it has one, without a sandbox: chained plugins that act on the
/// host side of a pod's NIC (`bandwidth`, which finds it as the container NIC's veth peer)
/// look for it there, as they find the bridge and ptp plugins' host ends.
pub fn add_result(
    cni_version: &str,
    container: InterfaceResult,
    host: Option<InterfaceResult>,
    ipam: &IpamResult,
) -> AddResult {
    let mut ips = ipam.ips.clone();
    for ip in &mut ips {
        ip.interface = Some(0);
    }
    let mut interfaces = vec![container];
    interfaces.extend(host.map(|h| InterfaceResult { sandbox: None, ..h }));
    AddResult {
        cni_version: cni_version.to_string(),
        interfaces,
        ips,
        routes: ipam.routes.clone(),
        dns: ipam.dns.clone(),
    }
}

/// The version to speak with a delegated plugin: ours if it speaks it, else the newest one
/// both speak that is not newer than ours (1.0 and 1.1 results are the same).
pub fn delegate_version(ours: &str, theirs: &[String]) -> Option<String> {
    if theirs.iter().any(|v| v == ours) {
        return Some(ours.to_string());
    }
    SUPPORTED_VERSIONS
        .iter()
        .rev()
        .filter(|v| version_key(v) <= version_key(ours))
        .find(|v| theirs.iter().any(|t| t == *v))
        .map(|v| v.to_string())
}

fn version_key(v: &str) -> Vec<u32> {
    v.split('.').map(|p| p.parse().unwrap_or(0)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> Result<Env, CniError> {
        let m: BTreeMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Env::from_vars(|k| m.get(k).cloned())
    }

    #[test]
    fn a_full_config() {
        let c = parse_config(
            br#"{"cniVersion":"1.0.0","name":"ov","type":"vnet-cni","vni":7,"mtu":1450,
                 "control":"127.0.0.1:7601","tokenFile":"/etc/vnet/token",
                 "ipam":{"type":"host-local","subnet":"10.1.0.0/24"},
                 "runtimeConfig":{"mac":"52:54:00:00:00:09"}}"#,
        )
        .unwrap();
        assert_eq!(c.vni, 7);
        assert_eq!(c.conf.mtu, Some(1450));
        assert_eq!(c.control.to_string(), "127.0.0.1:7601");
        assert_eq!(c.conf.ipam.as_ref().unwrap().plugin_type, "host-local");
        let e = env(&[("CNI_COMMAND", "ADD")]).unwrap();
        assert_eq!(
            requested_mac(&c.conf, &e).unwrap().unwrap().to_string(),
            "52:54:00:00:00:09"
        );
    }

    #[test]
    fn defaults_and_refusals() {
        let c = parse_config(br#"{"cniVersion":"1.1.0","name":"ov","type":"vnet-cni"}"#).unwrap();
        assert_eq!(
            (c.vni, c.control.to_string()),
            (1, DEFAULT_CONTROL.to_string())
        );
        let err = |b: &[u8]| parse_config(b).unwrap_err();
        assert_eq!(err(b"{").code, code::DECODING);
        assert_eq!(
            err(br#"{"cniVersion":"0.4.0","name":"x","type":"t"}"#).code,
            code::INCOMPATIBLE_VERSION
        );
        assert_eq!(
            err(br#"{"cniVersion":"1.0.0","name":"x","type":"t","vni":0}"#).code,
            code::INVALID_CONFIG
        );
        assert_eq!(
            err(br#"{"cniVersion":"1.0.0","name":"x","type":"t","vni":16777216}"#).code,
            code::INVALID_CONFIG
        );
        assert_eq!(
            err(br#"{"cniVersion":"1.0.0","name":"x","type":"t","mtu":20}"#).code,
            code::INVALID_CONFIG
        );
        assert_eq!(
            err(br#"{"cniVersion":"1.0.0","name":"x","type":"t","control":"nowhere"}"#).code,
            code::INVALID_CONFIG
        );
        assert_eq!(
            err(br#"{"cniVersion":"1.0.0","type":"t"}"#).code,
            code::INVALID_CONFIG
        );
    }

    #[test]
    fn the_environment() {
        let e = env(&[
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "abc"),
            ("CNI_NETNS", "/var/run/netns/x"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_ARGS", "IgnoreUnknown=1;MAC=52:54:00:00:00:0a"),
            ("CNI_PATH", "/usr/lib/cni:/opt/cni/bin"),
        ])
        .unwrap();
        assert_eq!(e.require_container().unwrap(), ("abc", "eth0"));
        assert_eq!(
            e.require_netns().unwrap(),
            PathBuf::from("/var/run/netns/x")
        );
        assert_eq!(e.path.len(), 2);
        let c = parse_config(br#"{"cniVersion":"1.0.0","name":"ov","type":"vnet-cni"}"#).unwrap();
        assert_eq!(
            requested_mac(&c.conf, &e).unwrap().unwrap().to_string(),
            "52:54:00:00:00:0a"
        );
        assert_eq!(env(&[]).unwrap_err().code, code::INVALID_ENV);
        assert_eq!(
            env(&[("CNI_COMMAND", "ADD"), ("CNI_ARGS", "junk")])
                .unwrap_err()
                .code,
            code::INVALID_ENV
        );
        let e = env(&[
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "a"),
            ("CNI_IFNAME", "a/b"),
        ])
        .unwrap();
        assert!(e.require_container().is_err());
        assert_eq!(e.require_netns().unwrap_err().code, code::INVALID_ENV);
        let e = env(&[
            ("CNI_COMMAND", "ADD"),
            ("CNI_ARGS", "MAC=01:00:5e:00:00:01"),
        ])
        .unwrap();
        assert!(requested_mac(&c.conf, &e).is_err());
    }

    #[test]
    fn the_result_names_the_host_end_of_the_veth() {
        let ipam: IpamResult = serde_json::from_str(
            r#"{"ips":[{"address":"10.77.0.10/24","gateway":"10.77.0.1"}],
                "routes":[{"dst":"0.0.0.0/0"}]}"#,
        )
        .unwrap();
        let container = InterfaceResult {
            name: "eth0".into(),
            mac: "52:54:00:00:00:01".into(),
            mtu: Some(1400),
            sandbox: Some("/var/run/netns/cni-1".into()),
        };
        let host = InterfaceResult {
            name: "vh-0123456789ab".into(),
            mac: "52:54:00:00:00:02".into(),
            mtu: Some(1400),
            sandbox: Some("ignored".into()),
        };
        let r = add_result("1.0.0", container.clone(), Some(host), &ipam);
        let v = serde_json::to_value(&r).unwrap();
        // The container's NIC keeps index 0 (the addresses name it); the host end has no
        // sandbox, which is how `bandwidth` tells it from the container's.
        assert_eq!(v["interfaces"][0]["name"], "eth0");
        assert_eq!(v["interfaces"][0]["sandbox"], "/var/run/netns/cni-1");
        assert_eq!(v["interfaces"][1]["name"], "vh-0123456789ab");
        assert!(v["interfaces"][1].get("sandbox").is_none(), "{v}");
        assert_eq!(v["ips"][0]["interface"], 0);
        assert_eq!(v["ips"][0]["gateway"], "10.77.0.1");
        assert_eq!(v["routes"][0]["dst"], "0.0.0.0/0");
        // A TAP (no fast path): the container's NIC alone.
        let r = add_result("1.0.0", container, None, &ipam);
        assert_eq!(r.interfaces.len(), 1);
    }

    #[test]
    fn networks_and_versions() {
        let n: IpNet = "10.1.0.5/24".parse().unwrap();
        assert_eq!(n.to_string(), "10.1.0.5/24");
        assert!("10.1.0.5".parse::<IpNet>().is_err());
        assert!("10.1.0.5/33".parse::<IpNet>().is_err());
        assert!("fd00::1/64".parse::<IpNet>().is_ok());
        let v = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            delegate_version("1.1.0", &v(&["0.4.0", "1.0.0"])).as_deref(),
            Some("1.0.0")
        );
        assert_eq!(
            delegate_version("1.1.0", &v(&["1.0.0", "1.1.0"])).as_deref(),
            Some("1.1.0")
        );
        assert_eq!(delegate_version("1.0.0", &v(&["1.1.0"])), None);
        assert_eq!(delegate_version("1.0.0", &v(&["0.3.1"])), None);
    }
}
