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
/// present in the output. nvlink's walk gives each object a block of names,
/// in link order. A ghost goes right after the names of the function before it
/// in its object (a live kernel ends with `.nv.shared.K`, a live device
/// function with `.text.F`, a dead kernel with its own ghost). A function an
/// earlier object already defined (a weak function in two objects: the first
/// definition wins) adds no names in this object and anchors nothing. With
/// nothing before it, a ghost opens its object's block: right before the
/// `.text.F` of the next live function of its object, or of the next object
/// that has functions (the first live one), or, when no later object has
/// functions, right before `.nv.callgraph`. Measured on sm_90 executable
/// links (weak function in 2 and 3 objects, dead kernel in any position,
/// `-lcudadevrt`, globals and constants in the next object). Not
/// reproduced (`NoAnchor`): a dead kernel another object also defines, and a
/// next object whose functions are all dead or already defined (its own
/// names, data's included, are not known here).
pub(crate) fn insert_ghosts(
    strings: &mut Vec<String>,
    objects: &[Vec<InputFunction>],
    live: &HashSet<String>,
) -> Result<(), StrTabError> {
    let position = |strings: &[String], name: &str| strings.iter().position(|s| s == name);
    // For each object, the functions it brings itself (not defined earlier).
    let mut earlier: HashSet<&str> = HashSet::new();
    let mut own: Vec<Vec<&InputFunction>> = Vec::with_capacity(objects.len());
    let mut duplicated: HashSet<&str> = HashSet::new();
    for funcs in objects {
        own.push(funcs.iter().filter(|f| !earlier.contains(f.name.as_str())).collect());
        duplicated.extend(funcs.iter().map(|f| f.name.as_str()).filter(|n| earlier.contains(n)));
        earlier.extend(funcs.iter().map(|f| f.name.as_str()));
    }
    for (o, funcs) in own.iter().enumerate() {
        for (i, f) in funcs.iter().enumerate() {
            if !f.is_kernel || live.contains(&f.name) {
                continue;
            }
            if duplicated.contains(f.name.as_str()) {
                return Err(StrTabError::NoAnchor(f.name.clone()));
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
                let first_live =
                    |fs: &[&InputFunction]| fs.iter().find(|n| live.contains(&n.name)).map(|n| n.name.clone());
                let next = match first_live(&funcs[i + 1..]) {
                    Some(n) => Some(format!(".text.{n}")),
                    // The next object with functions of its own opens the next block.
                    None => match own[o + 1..].iter().find(|fs| !fs.is_empty()) {
                        Some(fs) => first_live(fs).map(|n| format!(".text.{n}")),
                        None => Some(".nv.callgraph".to_owned()),
                    },
                };
                at = next.and_then(|n| position(strings, &n));
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

    #[test]
    fn weak_duplicates_add_no_names() {
        // nvlink on a.o (w, ka) b.o (w, kb) c.o (w, kc), a weak `w` in each, kb
        // dead: its ghost closes a.o's block. Then `a.o c.o b.o`: it goes last.
        let k = |n: &str| InputFunction { name: n.into(), is_kernel: true };
        let d = |n: &str| InputFunction { name: n.into(), is_kernel: false };
        let (a, b, c) = (vec![d("w"), k("ka")], vec![d("w"), k("kb")], vec![d("w"), k("kc")]);
        let live: HashSet<String> = ["w", "ka", "kc"].iter().map(|s| s.to_string()).collect();
        let owned = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let mut s = owned(&[".text.w", ".text.ka", ".rela.debug_frame", ".text.kc", ".rela.text.kc", ".nv.callgraph"]);
        insert_ghosts(&mut s, &[a.clone(), b.clone(), c.clone()], &live).unwrap();
        assert_eq!(
            s,
            owned(&[
                ".text.w",
                ".text.ka",
                ".rela.debug_frame",
                ".nv.shared.kb",
                ".text.kc",
                ".rela.text.kc",
                ".nv.callgraph"
            ])
        );
        let mut s = owned(&[".text.w", ".text.ka", ".rela.debug_frame", ".text.kc", ".rela.text.kc", ".nv.callgraph"]);
        insert_ghosts(&mut s, &[a, c, b], &live).unwrap();
        assert_eq!(
            s,
            owned(&[
                ".text.w",
                ".text.ka",
                ".rela.debug_frame",
                ".text.kc",
                ".rela.text.kc",
                ".nv.shared.kb",
                ".nv.callgraph"
            ])
        );
    }
}
