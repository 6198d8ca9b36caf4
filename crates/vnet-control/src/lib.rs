//! The vnet control language (docs/control-language.md): parsing text into [`Command`]s,
//! the configuration model [`Config`] that validates every command before anything changes
//! and says what must change in the data path ([`Change`]), and rendering the configuration
//! back into a script. Pure: no I/O.

#![forbid(unsafe_code)]

mod command;
mod diff;
mod model;
mod names;
mod render_config;
mod routes;
pub mod status;

pub use command::{
    parse_config, parse_line, parse_script, Command, DestKind, DestRef, DispatchMode, FastPathMode,
    InterfaceKind, InterfaceSpec, LinkKind, LinkSpec, NotifyMode, ParseError, PolicyUpdate,
    RateLimit, RouteOp, RouteSpec, ScriptError, Setting, ShowWhat, YieldStrategy, MAX_CPU,
    MAX_LINE_LEN, MAX_SCRIPT_LINES,
};
pub use model::{
    Change, Config, ConfigError, DataPathSettings, Interface, Link, PortPolicy, RouteChange,
    MAX_CONFIG_LINES, MAX_LISTENERS, MAX_PORTS, MAX_ROUTES,
};
pub use routes::{Route, Routes};
