//! The IPAM plugin (`host-local`, `static`, `dhcp`, ...): found in CNI_PATH and run with the
//! same environment and the network configuration on stdin, as the CNI specification's
//! delegation says, with the configuration's `cniVersion` set to one the plugin speaks.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::conf::{code, delegate_version, CniError, Env};

/// The most a delegated plugin may print.
const MAX_OUTPUT: usize = 1 << 20;

fn find(plugin: &str, env: &Env) -> Result<PathBuf, CniError> {
    if plugin.is_empty() || plugin.contains('/') || plugin.starts_with('.') {
        return Err(CniError::new(
            code::INVALID_CONFIG,
            "invalid network configuration",
            format!("ipam type {plugin:?} is not a plugin name"),
        ));
    }
    env.path
        .iter()
        .map(|d| d.join(plugin))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            CniError::new(
                code::IPAM,
                "IPAM plugin not found",
                format!("{plugin} is in none of CNI_PATH ({:?})", env.path),
            )
        })
}

fn run(bin: &PathBuf, command: &str, stdin: &[u8]) -> Result<(bool, Vec<u8>), CniError> {
    let io_err = |e: std::io::Error| {
        CniError::new(
            code::IPAM,
            "running the IPAM plugin",
            format!("{}: {e}", bin.display()),
        )
    };
    let mut child = Command::new(bin)
        .env("CNI_COMMAND", command)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(io_err)?;
    if let Some(mut i) = child.stdin.take() {
        match i.write_all(stdin) {
            // A plugin may exit without reading its input (host-local's VERSION does): its
            // exit status and output say how it went.
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
            r => r.map_err(io_err)?,
        }
    }
    let out = child.wait_with_output().map_err(io_err)?;
    let mut stdout = out.stdout;
    stdout.truncate(MAX_OUTPUT);
    Ok((out.status.success(), stdout))
}

/// The plugin's failure as our error, its own message kept.
fn failure(plugin: &str, command: &str, stdout: &[u8]) -> CniError {
    let (msg, details) = match serde_json::from_slice::<Value>(stdout) {
        Ok(v) => (
            v["msg"].as_str().unwrap_or("").to_string(),
            v["details"].as_str().unwrap_or("").to_string(),
        ),
        Err(_) => (
            String::from_utf8_lossy(stdout).trim().to_string(),
            String::new(),
        ),
    };
    CniError::new(
        code::IPAM,
        format!("IPAM plugin {plugin} failed {command}"),
        format!("{msg} {details}").trim().to_string(),
    )
}

/// The versions the plugin speaks.
pub fn versions(plugin: &str, env: &Env) -> Result<Vec<String>, CniError> {
    let bin = find(plugin, env)?;
    let (ok, out) = run(&bin, "VERSION", br#"{"cniVersion":"1.0.0"}"#)?;
    if !ok {
        return Err(failure(plugin, "VERSION", &out));
    }
    let v: Value = serde_json::from_slice(&out)
        .map_err(|e| CniError::new(code::IPAM, "IPAM VERSION answer", e.to_string()))?;
    Ok(v["supportedVersions"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default())
}

/// Runs `command` of the IPAM plugin with `config` (the whole network configuration) and
/// returns what it printed (the result, for ADD). `None` when the plugin does not speak a
/// version that has the command (STATUS and GC need 1.1.0): nothing to delegate.
pub fn delegate(
    plugin: &str,
    command: &str,
    env: &Env,
    config: &Value,
) -> Result<Option<Vec<u8>>, CniError> {
    let ours = config["cniVersion"].as_str().unwrap_or("1.0.0").to_string();
    let theirs = versions(plugin, env)?;
    let Some(v) = delegate_version(&ours, &theirs) else {
        return Err(CniError::new(
            code::INCOMPATIBLE_VERSION,
            format!("IPAM plugin {plugin} speaks no version of ours"),
            format!("it speaks {}", theirs.join(", ")),
        ));
    };
    if matches!(command, "STATUS" | "GC") && v == "1.0.0" {
        return Ok(None);
    }
    let mut conf = config.clone();
    conf["cniVersion"] = Value::String(v);
    let stdin = serde_json::to_vec(&conf).unwrap_or_default();
    let (ok, out) = run(&find(plugin, env)?, command, &stdin)?;
    if !ok {
        return Err(failure(plugin, command, &out));
    }
    Ok(Some(out))
}
