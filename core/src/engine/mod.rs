//! Engines carry out a link plan: [`inprocess`] with libnvJitLink and the
//! finalizer (compile steps through [`ptxas`], results cached in
//! [`artifacts`]), [`process`] by running the real nvlink.

pub mod artifacts;
pub mod inprocess;
pub mod process;
pub mod ptxas;
pub mod sandbox;
