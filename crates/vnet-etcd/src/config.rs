//! How to reach etcd: the client's configuration, its endpoint list and URLs, the password
//! file and the TLS settings built from the PEM files. Pure (files aside): no connection here.

use crate::Error;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

/// How to reach etcd.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// `host:port` or `http(s)://host:port`; without a scheme, https when a CA is given.
    pub endpoints: Vec<String>,
    /// Connect timeout and whole-call timeout of unary calls.
    pub timeout: Duration,
    /// PEM file of the CA that signed the servers' certificates (enables TLS).
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate and key, for servers that require client certificates.
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    /// User name and password for etcd's authentication.
    pub user: Option<(String, String)>,
}

impl ClientConfig {
    pub fn new(endpoints: &str) -> ClientConfig {
        ClientConfig {
            endpoints: split_endpoints(endpoints),
            timeout: Duration::from_secs(3),
            ca_file: None,
            cert_file: None,
            key_file: None,
            user: None,
        }
    }
}

/// A password file's one line, without its line end.
pub fn read_password(path: &Path) -> Result<String, Error> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::Password(format!("{}: {e}", path.display())))?;
    let p = text.trim_end_matches(['\n', '\r']);
    if p.is_empty() || p.contains('\n') {
        return Err(Error::Password(format!(
            "{} must hold one line",
            path.display()
        )));
    }
    Ok(p.to_string())
}

/// Splits a comma-separated endpoint list, dropping empty items.
pub fn split_endpoints(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(String::from)
        .collect()
}

/// An endpoint as a base URL without a trailing slash.
pub(crate) fn endpoint_url(e: &str, tls: bool) -> Result<String, Error> {
    if tls && e.starts_with("http://") {
        // A CA or client certificate was given: never fall back to plain text silently.
        return Err(Error::Endpoint(format!(
            "{e} (http:// with TLS settings; use https:// or no scheme)"
        )));
    }
    let url = if e.starts_with("http://") || e.starts_with("https://") {
        e.trim_end_matches('/').to_string()
    } else {
        format!("{}://{}", if tls { "https" } else { "http" }, e)
    };
    let rest = url.split_once("://").map(|(_, r)| r).unwrap_or("");
    if rest.is_empty() || rest.contains(['/', ' ', '?', '#']) {
        return Err(Error::Endpoint(e.to_string()));
    }
    Ok(url)
}

fn read_pem(path: &Path, what: &str) -> Result<Vec<u8>, Error> {
    let pem = std::fs::read(path).map_err(|e| Error::Tls(format!("{}: {e}", path.display())))?;
    // tonic reads the PEM only when it connects: a file that holds nothing of the kind is
    // refused here, where the mistake was made.
    if !String::from_utf8_lossy(&pem).contains(&format!("-----BEGIN {what}")) {
        return Err(Error::Tls(format!("{}: no {what}", path.display())));
    }
    Ok(pem)
}

/// The TLS settings of the channels: the CA to trust and, optionally, the client certificate.
pub(crate) fn tls_config(cfg: &ClientConfig, ca: &Path) -> Result<ClientTlsConfig, Error> {
    let tls =
        ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read_pem(ca, "CERTIFICATE")?));
    match (&cfg.cert_file, &cfg.key_file) {
        (Some(cert), Some(key)) => {
            let cert = read_pem(cert, "CERTIFICATE")?;
            let key_pem = read_pem(key, "")?;
            if !String::from_utf8_lossy(&key_pem).contains("PRIVATE KEY-----") {
                return Err(Error::Tls(format!("{}: no private key", key.display())));
            }
            Ok(tls.identity(Identity::from_pem(cert, key_pem)))
        }
        (None, None) => Ok(tls),
        _ => Err(Error::Tls(
            "a client certificate needs its key, and back".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        assert_eq!(
            split_endpoints(" 127.0.0.1:2379, http://h:1 ,,"),
            vec!["127.0.0.1:2379", "http://h:1"]
        );
        assert_eq!(
            endpoint_url("127.0.0.1:2379", false).unwrap(),
            "http://127.0.0.1:2379"
        );
        assert_eq!(endpoint_url("h:1", true).unwrap(), "https://h:1");
        assert!(endpoint_url("http://h:1/", true).is_err());
        assert_eq!(endpoint_url("http://h:1/", false).unwrap(), "http://h:1");
        assert!(endpoint_url("http://", false).is_err());
        assert!(endpoint_url("h:1/x", false).is_err());
    }
}
