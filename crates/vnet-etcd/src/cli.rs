//! The command-line flags vnetd and vnetctl share to name an overlay in etcd and reach etcd
//! (feature `cli`): one definition, the overlay's name checked as it is parsed.

use std::path::PathBuf;

use crate::{read_password, ClientConfig, Error};

/// Which overlay in which etcd, as vnetd and vnetctl take it on their command lines: `--etcd`,
/// `--overlay` (checked here, once) and how to reach etcd securely ([`EtcdAccess`]).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct OverlayArgs {
    /// etcd endpoints (comma-separated `host:port` or URLs) of the overlay: vnetd takes its
    /// links and routes to the other hosts from there, vnetctl manages the overlay there
    /// instead of one vnetd (docs/control-language.md, "Many hosts from etcd").
    #[arg(long, requires = "overlay")]
    pub etcd: Option<String>,
    /// The overlay's name in etcd (keys under `/vnet/NAME/`; 1 to 32 of `A-Z a-z 0-9 _ - .`).
    #[arg(long, requires = "etcd")]
    pub overlay: Option<vnet_cluster::OverlayName>,
    #[command(flatten)]
    pub access: EtcdAccess,
}

impl OverlayArgs {
    /// The overlay and the client's configuration (endpoints, TLS files, credentials), when
    /// `--etcd` was given.
    pub fn client_config(
        &self,
    ) -> Result<Option<(vnet_cluster::OverlayName, ClientConfig)>, Error> {
        let (Some(endpoints), Some(overlay)) = (&self.etcd, &self.overlay) else {
            return Ok(None);
        };
        let mut cc = ClientConfig::new(endpoints);
        self.access.apply_to(&mut cc)?;
        Ok(Some((overlay.clone(), cc)))
    }
}

/// How to reach etcd securely, as the `--etcd-*` flags of vnetd and vnetctl give it (part of
/// [`OverlayArgs`], whose `--etcd` these require).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct EtcdAccess {
    /// PEM file of the CA of etcd's server certificates (enables TLS).
    #[arg(long, requires = "etcd")]
    pub etcd_ca: Option<PathBuf>,
    /// PEM client certificate for etcd (with --etcd-key).
    #[arg(long, requires_all = ["etcd_key", "etcd_ca"])]
    pub etcd_cert: Option<PathBuf>,
    /// PEM private key of --etcd-cert.
    #[arg(long, requires = "etcd_cert")]
    pub etcd_key: Option<PathBuf>,
    /// etcd user name (with --etcd-password-file).
    #[arg(long, requires_all = ["etcd_password_file", "etcd"])]
    pub etcd_user: Option<String>,
    /// A file holding the etcd user's password (one line).
    #[arg(long, requires = "etcd_user")]
    pub etcd_password_file: Option<PathBuf>,
}

impl EtcdAccess {
    /// Puts the TLS files and the credentials (the password read from its file) into `cc`.
    pub fn apply_to(&self, cc: &mut ClientConfig) -> Result<(), Error> {
        cc.ca_file = self.etcd_ca.clone();
        cc.cert_file = self.etcd_cert.clone();
        cc.key_file = self.etcd_key.clone();
        if let (Some(user), Some(path)) = (&self.etcd_user, &self.etcd_password_file) {
            cc.user = Some((user.clone(), read_password(path)?));
        }
        Ok(())
    }
}
