//! The nvlink command line: the option table ([`options`]), the grammar
//! ([`parse`]), the typed link specification with nvlink's mode dispatch
//! ([`spec`]), and the link target and its arch rules ([`target`]).

pub mod options;
pub mod parse;
pub mod render;
pub mod spec;
pub mod target;
