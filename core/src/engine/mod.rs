//! Engines carry out a link plan: [`inprocess`] with libnvJitLink and the
//! finalizer, [`process`] by running the real nvlink.

pub mod inprocess;
pub mod process;
