//! The nvlink command line: the option table ([`options`]), the grammar
//! ([`parse`]), and the typed link specification with nvlink's mode dispatch
//! ([`spec`]).

pub mod options;
pub mod parse;
pub mod render;
pub mod spec;
