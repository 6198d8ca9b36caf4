//! The names the schema puts in keys (overlay, host id, route id): one checked type each, so a
//! name that reached a key or a record has passed its rule.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::schema::{quote, SchemaError, MAX_HOST_ID_LEN, MAX_OVERLAY_NAME_LEN, MAX_ROUTE_ID_LEN};

const NAME_RULE: &str = "letters, digits, _ - . only, not . or ..";

fn check_name(s: &str, what: &'static str, max: usize) -> Result<(), SchemaError> {
    let ok = !s.is_empty()
        && s.len() <= max
        && s != "."
        && s != ".."
        && s.bytes()
            .all(|c| c.is_ascii_alphanumeric() || b"_-.".contains(&c));
    if ok {
        Ok(())
    } else {
        Err(SchemaError::BadName {
            what,
            value: quote(s),
            rule: NAME_RULE,
        })
    }
}

macro_rules! name_type {
    ($(#[$doc:meta])* $t:ident, $what:literal, $max:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $t(String);

        impl $t {
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl FromStr for $t {
            type Err = SchemaError;
            fn from_str(s: &str) -> Result<Self, SchemaError> {
                check_name(s, $what, $max)?;
                Ok($t(s.to_string()))
            }
        }

        impl TryFrom<String> for $t {
            type Error = SchemaError;
            fn try_from(s: String) -> Result<Self, SchemaError> {
                check_name(&s, $what, $max)?;
                Ok($t(s))
            }
        }

        impl From<$t> for String {
            fn from(v: $t) -> String {
                v.0
            }
        }

        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

name_type!(
    /// The name of an overlay: 1 to 32 of `A-Z a-z 0-9 _ - .`.
    OverlayName,
    "overlay name",
    MAX_OVERLAY_NAME_LEN
);
name_type!(
    /// A host's id in the overlay: 1 to 20 of `A-Z a-z 0-9 _ - .`.
    HostId,
    "host id",
    MAX_HOST_ID_LEN
);
name_type!(
    /// The id of an operator route: 1 to 64 of `A-Z a-z 0-9 _ - .`.
    RouteId,
    "route id",
    MAX_ROUTE_ID_LEN
);
