//! Which control-port token a client presents. The package makes `/etc/vnet/token` (readable by
//! root only) and vnetd uses it, so clients find it without being told: a file the user names
//! (vnetctl's `--token-file`, vnet-cni's `tokenFile`) wins, then `$VNET_TOKEN_FILE`, then that
//! default when it exists. A default that exists but cannot be read is not an error by itself
//! (vnetd may not ask for a token); the caller decides ([`Token::Unreadable`]).

use std::ffi::OsStr;
use std::io;
use std::path::{Path, PathBuf};

use crate::Error;

pub const DEFAULT_TOKEN_FILE: &str = "/etc/vnet/token";
pub const TOKEN_FILE_ENV: &str = "VNET_TOKEN_FILE";

/// The token file to use, and how it was chosen.
#[derive(Debug, PartialEq, Eq)]
pub enum TokenFile {
    /// Named by the user (a flag, the configuration, or the environment): it must be readable.
    Given(PathBuf),
    /// The package's default: used when it exists and can be read.
    Default(PathBuf),
}

/// The precedence: the named file, then the environment variable (unless empty), then the
/// default.
pub fn choose(given: Option<&Path>, env: Option<&OsStr>, default: &Path) -> TokenFile {
    if let Some(p) = given {
        return TokenFile::Given(p.to_path_buf());
    }
    match env.filter(|e| !e.is_empty()) {
        Some(e) => TokenFile::Given(PathBuf::from(e)),
        None => TokenFile::Default(default.to_path_buf()),
    }
}

/// [`choose`] with this process's environment and the package's default.
pub fn choose_here(given: Option<&Path>) -> TokenFile {
    choose(
        given,
        std::env::var_os(TOKEN_FILE_ENV).as_deref(),
        Path::new(DEFAULT_TOKEN_FILE),
    )
}

/// What to present to vnetd.
#[derive(Debug)]
pub enum Token {
    Use(String),
    None,
    /// The default file exists but could not be read: nothing to present.
    Unreadable(PathBuf, io::Error),
}

impl Token {
    /// The token to present, if any.
    pub fn word(&self) -> Option<&str> {
        match self {
            Token::Use(t) => Some(t),
            _ => None,
        }
    }
}

fn token_error(path: &Path, reason: impl ToString) -> Error {
    Error::Token {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

/// Reads the chosen file: a given one must be readable; a missing default means no token.
/// Either must hold one word.
pub fn load(choice: TokenFile) -> Result<Token, Error> {
    let (path, given) = match choice {
        TokenFile::Given(p) => (p, true),
        TokenFile::Default(p) => (p, false),
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if given => return Err(token_error(&path, e)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Token::None),
        Err(e) => return Ok(Token::Unreadable(path, e)),
    };
    let t = text.trim();
    if t.is_empty() || t.contains(char::is_whitespace) {
        return Err(token_error(&path, "must hold one word"));
    }
    Ok(Token::Use(t.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_named_file_wins_then_the_environment_then_the_default() {
        let d = Path::new(DEFAULT_TOKEN_FILE);
        let (named, env) = (Path::new("/x/named"), OsStr::new("/x/env"));
        assert_eq!(
            choose(Some(named), Some(env), d),
            TokenFile::Given(named.into())
        );
        assert_eq!(choose(Some(named), None, d), TokenFile::Given(named.into()));
        assert_eq!(choose(None, Some(env), d), TokenFile::Given(env.into()));
        assert_eq!(choose(None, None, d), TokenFile::Default(d.into()));
        // An empty variable is as good as none.
        assert_eq!(
            choose(None, Some(OsStr::new("")), d),
            TokenFile::Default(d.into())
        );
    }

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("vnet-client-token-{}-{name}", std::process::id()));
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
        assert!(
            matches!(&e, Error::Token { path, .. } if *path == gone),
            "{e}"
        );
        std::fs::write(&gone, "  s3cret\n").expect("write");
        for choice in [
            TokenFile::Default(gone.clone()),
            TokenFile::Given(gone.clone()),
        ] {
            assert_eq!(load(choice).expect("read").word(), Some("s3cret"));
        }
        for bad in ["two words\n", " \n"] {
            std::fs::write(&gone, bad).expect("write");
            assert!(matches!(
                load(TokenFile::Default(gone.clone())),
                Err(Error::Token { .. })
            ));
        }
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn an_unreadable_default_is_not_an_error_by_itself_but_an_unreadable_given_file_is() {
        // A directory cannot be read as a file, whoever runs the test (root reads anything).
        let dir = scratch("unreadable");
        let t = load(TokenFile::Default(dir.clone())).expect("not an error by itself");
        assert!(matches!(&t, Token::Unreadable(p, _) if *p == dir));
        assert_eq!(t.word(), None);
        assert!(load(TokenFile::Given(dir.clone())).is_err());
        let _ = std::fs::remove_dir_all(dir);
    }
}
