//! What the daemon tells: the event stream (`nvlinkd events`) and `/metrics`.

pub mod events;
pub mod metrics;
