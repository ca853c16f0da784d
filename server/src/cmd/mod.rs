//! The subcommands that are not the daemon: control of a running daemon
//! (`start`, `stop`, `status`, `stats`, `events`), `exec`, `install` and `watch`.

pub mod config;
pub mod control;
pub mod exec;
pub mod install;
pub mod watch;
