//! String tables, and the names nvlink leaves behind when it removes dead kernels.
//!
//! nvlink and nvJitLink build `.shstrtab` and `.strtab` in the order they first
//! need a name, and never take a name out again. Their merge walks each input's
//! functions in `.text` section order; a kernel gets its `.text.K`,
//! `.nv.info.K` and `.nv.shared.K` names there. nvlink decides which kernels are
//! dead (no host reference, no device caller) *during* that walk, so a dead
//! kernel still leaves its `.nv.shared.K` name behind: a "ghost" string with no
//! section. nvJitLink, told the live kernels up front with `-kernels-used`,
//! never visits dead kernels. [`insert_ghosts`] puts the ghosts where nvlink's
//! walk would have created them; [`StrTab::remap`] then moves every reference.

use std::collections::{HashMap, HashSet};

/// A parsed ELF string table: NUL-separated strings, the first one empty.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StrTab {
    pub strings: Vec<String>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum StrTabError {
    #[error("string table not NUL-terminated")]
    Unterminated,
    #[error("string table is not UTF-8")]
    NotUtf8,
    #[error("no anchor for ghost name of dead kernel {0}")]
    NoAnchor(String),
    #[error("duplicate string in table: {0}")]
    Duplicate(String),
}

impl StrTab {
    pub fn parse(bytes: &[u8]) -> Result<Self, StrTabError> {
        let Some(body) = bytes.strip_suffix(&[0]) else {
            return if bytes.is_empty() { Ok(StrTab { strings: vec![] }) } else { Err(StrTabError::Unterminated) };
        };
        let strings = body
            .split(|&b| b == 0)
            .map(|s| std::str::from_utf8(s).map(str::to_owned).map_err(|_| StrTabError::NotUtf8))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(StrTab { strings })
    }

    pub(crate) fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for s in &self.strings {
            out.extend_from_slice(s.as_bytes());
            out.push(0);
        }
        out
    }

    fn starts(&self) -> Vec<u32> {
        let mut pos = 0u32;
        self.strings
            .iter()
            .map(|s| {
                let p = pos;
                pos += s.len() as u32 + 1;
                p
            })
            .collect()
    }

    /// A function mapping offsets into `self` to offsets into `new`, for tables
    /// holding the same strings (plus or minus some) in another order. An offset
    /// into the middle of a string keeps its distance from the string's start.
    pub(crate) fn remap<'a>(&'a self, new: &'a StrTab) -> Result<impl Fn(u32) -> Option<u32> + 'a, StrTabError> {
        let old_starts = self.starts();
        let new_starts = new.starts();
        let mut new_index: HashMap<&str, u32> = HashMap::with_capacity(new.strings.len());
        for (s, &p) in new.strings.iter().zip(&new_starts) {
            if !s.is_empty() && new_index.insert(s.as_str(), p).is_some() {
                return Err(StrTabError::Duplicate(s.clone()));
            }
        }
        Ok(move |off: u32| {
            let i = match old_starts.binary_search(&off) {
                Ok(i) => i,
                Err(0) => return None,
                Err(i) => i - 1,
            };
            let s = self.strings.get(i)?;
            let delta = off - old_starts[i];
            if s.is_empty() {
                return if delta == 0 { Some(0) } else { None };
            }
            if delta as usize > s.len() {
                return None;
            }
            new_index.get(s.as_str()).map(|p| p + delta)
        })
    }
}

/// A function of one input cubin, in `.text` section order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InputFunction {
    pub name: String,
    pub is_kernel: bool,
}

/// Insert the ghost `.nv.shared.K` names of dead kernels into `strings`, the
/// string list of an output produced without those kernels.
///
/// `objects` are the inputs' function lists in link order; `live` the functions
/// present in the output. A ghost goes right after the names of the function
/// before it in its object (a live kernel ends with `.nv.shared.K`, a live
/// device function with `.text.F`, a dead kernel with its own ghost); the first
/// function of an object anchors on the next live function's `.text.F`.
pub(crate) fn insert_ghosts(
    strings: &mut Vec<String>,
    objects: &[Vec<InputFunction>],
    live: &HashSet<String>,
) -> Result<(), StrTabError> {
    let position = |strings: &[String], name: &str| strings.iter().position(|s| s == name);
    for funcs in objects {
        for (i, f) in funcs.iter().enumerate() {
            if !f.is_kernel || live.contains(&f.name) {
                continue;
            }
            let ghost = format!(".nv.shared.{}", f.name);
            if let Some(p) = position(strings, &ghost) {
                strings.remove(p);
            }
            let mut at = None;
            for prev in funcs[..i].iter().rev() {
                let anchor = if live.contains(&prev.name) {
                    if prev.is_kernel {
                        format!(".nv.shared.{}", prev.name)
                    } else {
                        format!(".text.{}", prev.name)
                    }
                } else if prev.is_kernel {
                    format!(".nv.shared.{}", prev.name)
                } else {
                    continue;
                };
                at = position(strings, &anchor).map(|p| p + 1);
                break;
            }
            if at.is_none() {
                at = funcs[i + 1..]
                    .iter()
                    .find(|n| live.contains(&n.name))
                    .and_then(|n| position(strings, &format!(".text.{}", n.name)));
            }
            let at = at.ok_or_else(|| StrTabError::NoAnchor(f.name.clone()))?;
            strings.insert(at, ghost);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tab(items: &[&str]) -> StrTab {
        StrTab { strings: items.iter().map(|s| s.to_string()).collect() }
    }

    #[test]
    fn parse_roundtrip() {
        let t = StrTab::parse(b"\0.text\0.data\0").unwrap();
        assert_eq!(t.strings, vec!["", ".text", ".data"]);
        assert_eq!(t.to_bytes(), b"\0.text\0.data\0");
        assert!(StrTab::parse(b"\0abc").is_err());
    }

    #[test]
    fn remap_follows_strings_and_inner_offsets() {
        let old = tab(&["", "a", "bcd"]);
        let new = tab(&["", "x", "bcd", "a"]);
        let f = old.remap(&new).unwrap();
        assert_eq!(f(0), Some(0));
        assert_eq!(f(1), Some(7)); // "a"
        assert_eq!(f(3), Some(3)); // "bcd"
        assert_eq!(f(4), Some(4)); // "cd"
        assert_eq!(f(100), None);
    }

    #[test]
    fn ghosts_follow_the_walk() {
        // nvlink on g1.o (k_dead2, k_live, k_dead1) and g2.o (k_live2, k_dead3, helper_live, helper_dead)
        let k = |n: &str| InputFunction { name: n.into(), is_kernel: true };
        let d = |n: &str| InputFunction { name: n.into(), is_kernel: false };
        let objects = vec![
            vec![k("k_dead2"), k("k_live"), k("k_dead1")],
            vec![k("k_live2"), k("k_dead3"), d("helper_live"), d("helper_dead")],
        ];
        let live: HashSet<String> = ["k_live", "k_live2", "helper_live"].iter().map(|s| s.to_string()).collect();
        let mut s: Vec<String> = [
            "",
            ".nv.compat",
            ".text.k_live",
            ".nv.info.k_live",
            ".nv.shared.k_live",
            ".nv.shared.k_dead2",
            ".nv.global",
            ".text.k_live2",
            ".nv.info.k_live2",
            ".nv.shared.k_live2",
            ".text.helper_live",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        insert_ghosts(&mut s, &objects, &live).unwrap();
        let expect = [
            "",
            ".nv.compat",
            ".nv.shared.k_dead2",
            ".text.k_live",
            ".nv.info.k_live",
            ".nv.shared.k_live",
            ".nv.shared.k_dead1",
            ".nv.global",
            ".text.k_live2",
            ".nv.info.k_live2",
            ".nv.shared.k_live2",
            ".nv.shared.k_dead3",
            ".text.helper_live",
        ];
        assert_eq!(s, expect);
    }
}
