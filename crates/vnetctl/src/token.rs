//! Which control-port token vnetctl presents. The package makes `/etc/vnet/token` (readable by
//! root only) and vnetd uses it, so vnetctl finds it without flags: `--token-file` wins, then
//! `$VNET_TOKEN_FILE`, then that default when it exists. A default that exists but cannot be
//! read (vnetctl not run as root) is not an error by itself: vnetd may not ask for a token;
//! if it does, the refusal says why there was none.

use std::ffi::OsStr;
use std::io;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

pub const DEFAULT_TOKEN_FILE: &str = "/etc/vnet/token";
pub const TOKEN_FILE_ENV: &str = "VNET_TOKEN_FILE";

/// The token file to use, and how it was chosen.
#[derive(Debug, PartialEq, Eq)]
pub enum TokenFile {
    /// Named by the user (`--token-file` or the environment): it must be readable.
    Given(PathBuf),
    /// The package's default: used when it exists and can be read.
    Default(PathBuf),
}

/// The precedence: the flag, then the environment variable (unless empty), then the default.
pub fn choose(flag: Option<&Path>, env: Option<&OsStr>, default: &Path) -> TokenFile {
    if let Some(p) = flag {
        return TokenFile::Given(p.to_path_buf());
    }
    match env.filter(|e| !e.is_empty()) {
        Some(e) => TokenFile::Given(PathBuf::from(e)),
        None => TokenFile::Default(default.to_path_buf()),
    }
}

/// What to present to vnetd.
#[derive(Debug)]
pub enum Token {
    Use(String),
    None,
    /// The default file exists but could not be read: present nothing, and say why if vnetd
    /// asks for a token.
    Unreadable(PathBuf, io::Error),
}

/// Reads the chosen file.
pub fn load(choice: TokenFile) -> Result<Token> {
    let (path, given) = match choice {
        TokenFile::Given(p) => (p, true),
        TokenFile::Default(p) => (p, false),
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if given => return Err(e).with_context(|| format!("token file {}", path.display())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Token::None),
        Err(e) => return Ok(Token::Unreadable(path, e)),
    };
    let t = text.trim();
    if t.is_empty() || t.contains(char::is_whitespace) {
        bail!("token file {}: must hold one word", path.display());
    }
    Ok(Token::Use(t.to_string()))
}

/// The message for vnetd's refusal when no token was presented because the default file
/// could not be read; None when that is not why.
pub fn why_refused(token: &Token, refusal: &str) -> Option<String> {
    match token {
        Token::Unreadable(path, e) if refusal == "authentication failed" => Some(format!(
            "vnetd asks for a token: {} exists but cannot be read ({e}); \
             run vnetctl as root or give --token-file",
            path.display()
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_wins_then_the_environment_then_the_default() {
        let d = Path::new(DEFAULT_TOKEN_FILE);
        let (flag, env) = (Path::new("/x/flag"), OsStr::new("/x/env"));
        assert_eq!(
            choose(Some(flag), Some(env), d),
            TokenFile::Given(flag.into())
        );
        assert_eq!(choose(Some(flag), None, d), TokenFile::Given(flag.into()));
        assert_eq!(choose(None, Some(env), d), TokenFile::Given(env.into()));
        assert_eq!(choose(None, None, d), TokenFile::Default(d.into()));
        // An empty variable is as good as none.
        assert_eq!(
            choose(None, Some(OsStr::new("")), d),
            TokenFile::Default(d.into())
        );
    }

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("vnetctl-token-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        dir
    }

    #[test]
    fn a_missing_default_means_no_token_and_a_missing_given_file_is_an_error() {
        let dir = scratch("missing");
        let gone = dir.join("token");
        assert!(matches!(
            load(TokenFile::Default(gone.clone())).expect("no error"),
            Token::None
        ));
        let e = load(TokenFile::Given(gone.clone())).unwrap_err();
        assert!(format!("{e:#}").contains("token file"), "{e:#}");
        std::fs::write(&gone, "  s3cret\n").expect("write");
        for choice in [
            TokenFile::Default(gone.clone()),
            TokenFile::Given(gone.clone()),
        ] {
            assert!(matches!(load(choice).expect("read"), Token::Use(t) if t == "s3cret"));
        }
        std::fs::write(&gone, "two words\n").expect("write");
        assert!(load(TokenFile::Default(gone)).is_err());
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn an_unreadable_default_is_reported_only_when_vnetd_asks() {
        // A directory cannot be read as a file, whoever runs the test (root reads anything).
        let dir = scratch("unreadable");
        let t = load(TokenFile::Default(dir.clone())).expect("not an error by itself");
        assert!(matches!(t, Token::Unreadable(..)));
        let msg = why_refused(&t, "authentication failed").expect("explained");
        assert!(msg.contains(&dir.display().to_string()) && msg.contains("--token-file"));
        assert_eq!(why_refused(&t, "unknown command"), None);
        assert_eq!(why_refused(&Token::None, "authentication failed"), None);
        assert!(load(TokenFile::Given(dir.clone())).is_err());
        let _ = std::fs::remove_dir_all(dir);
    }
}
