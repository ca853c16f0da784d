//! Test harness: the real toolkit, the compiled corpus, a private daemon, and
//! comparison of nvlinkd's results with the real nvlink's.
//!
//! Every test compares against the real nvlink run on the same inputs in the
//! same run; nothing here hard-codes an output a tool could produce.

pub mod buildgrid;
pub mod compare;
pub mod corpus;
pub mod daemon;
pub mod env;
pub mod events;
pub mod gen;
pub mod remote;
pub mod run;
pub mod wan;
