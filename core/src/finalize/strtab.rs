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

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

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

/// One linked cubin, as the ghost names need it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InputObject {
    /// Its functions, in `.text` section order.
    pub functions: Vec<InputFunction>,
    /// The names it brings to the string tables
    /// ([`crate::input::cubin::CubinInfo::names`]).
    pub names: Arc<[String]>,
}

/// The names the linker writes before every object's names (`HEAD`) and after
/// them (`TAIL`), whichever objects have them too.
const HEAD: &[&str] = &[
    "",
    ".shstrtab",
    ".strtab",
    ".symtab",
    ".symtab_shndx",
    ".note.nv.tkinfo",
    ".note.nv.cuinfo",
    ".nv.info",
    ".nv.compat",
];
const TAIL: &[&str] = &[".nv.callgraph", ".nv.prototype", ".nv.rel.action"];

/// Which block of the string tables each known name belongs to: 0 for the
/// linker's head, `o + 1` for the first object `o` (in link order) that can
/// bring the name, `objects + 1` for the linker's tail. An object can bring its
/// own names ([`InputObject::names`]) and those of its functions' sections
/// (`.text.F`, `.nv.info.F`, `.nv.shared.F`, `.nv.constant0.F`,
/// `.rel.nv.constant0.F`, `.rela.text.F`). Global symbol names come after the
/// tail in `.strtab` and are not known here.
struct Blocks<'a> {
    rank: HashMap<Cow<'a, str>, usize>,
}

impl<'a> Blocks<'a> {
    fn new(objects: &'a [InputObject]) -> Self {
        let mut rank: HashMap<Cow<'a, str>, usize> = HashMap::new();
        for (o, obj) in objects.iter().enumerate() {
            let mut add = |name: Cow<'a, str>| {
                rank.entry(name).or_insert(o + 1);
            };
            for n in obj.names.iter() {
                add(Cow::Borrowed(n.as_str()));
            }
            for f in &obj.functions {
                let n = &f.name;
                for name in
                    [".text.", ".nv.info.", ".nv.shared.", ".nv.constant0.", ".rel.nv.constant0.", ".rela.text."]
                {
                    add(Cow::Owned(format!("{name}{n}")));
                }
            }
        }
        for n in HEAD {
            rank.insert(Cow::Borrowed(n), 0);
        }
        for n in TAIL {
            rank.insert(Cow::Borrowed(n), objects.len() + 1);
        }
        Blocks { rank }
    }

    fn rank(&self, name: &str) -> Option<usize> {
        self.rank.get(name).copied()
    }

    /// Where object `o`'s block starts in `strings`: at the first name of `o`,
    /// of a later object or of the tail. `None` when that is not sure: a name
    /// of an earlier object (or of the head) comes after it, or the name just
    /// before it is of no known block (it could be `o`'s: a renamed local
    /// symbol, a name the linker made).
    fn start(&self, strings: &[String], o: usize) -> Option<usize> {
        let at = strings.iter().position(|s| self.rank(s).is_some_and(|r| r > o))?;
        if strings[at..].iter().any(|s| self.rank(s).is_some_and(|r| r <= o)) {
            return None;
        }
        self.rank(strings.get(at.checked_sub(1)?)?)?;
        Some(at)
    }
}

/// Insert the ghost `.nv.shared.K` names of dead kernels into `strings`, the
/// string list of an output produced without those kernels.
///
/// `objects` are the linked cubins in link order; `live` the functions
/// present in the output. nvlink's walk gives each object a block of names,
/// in link order: first its functions' (`.text.F`, `.nv.info.K`,
/// `.nv.shared.K` in `.text` order), then its data's, debug sections' and
/// the rest. A ghost goes right after the names of the function before it
/// in its object (a live kernel ends with `.nv.shared.K`, a live device
/// function with `.text.F`, a dead kernel with its own ghost). A function an
/// earlier object already defined (a weak function in two objects: the first
/// definition wins) adds no names in this object and anchors nothing. With
/// nothing before it, a ghost opens its object's block: right before the
/// `.text.F` of the next live function of its object, or, when none is left,
/// before the first name the object brings itself (a `.nv.global`, a
/// `.nv.constant3`, `.debug_frame`, `-lineinfo`'s `.nv_debug_ptx_txt.N`,
/// `.nv_debug.shared`), or when it brings none, where the next block starts
/// (the next object's, or the tail's `.nv.callgraph`). Measured on sm_90
/// executable links (weak function in 2 and 3 objects, dead kernel in any
/// position, the dead kernel's object first, in the middle and last, alone
/// or with a global, a constant, printf, static or `extern __shared__`
/// memory, plain, `-lineinfo` and `-G` objects, `-lcudadevrt`). Not
/// reproduced (`NoAnchor`): a dead kernel another object also defines, and a
/// block start that the names do not tell ([`Blocks::start`]).
pub(crate) fn insert_ghosts(
    strings: &mut Vec<String>,
    objects: &[InputObject],
    live: &HashSet<String>,
) -> Result<(), StrTabError> {
    let position = |strings: &[String], name: &str| strings.iter().position(|s| s == name);
    // For each object, the functions it brings itself (not defined earlier).
    let mut earlier: HashSet<&str> = HashSet::new();
    let mut own: Vec<Vec<&InputFunction>> = Vec::with_capacity(objects.len());
    let mut duplicated: HashSet<&str> = HashSet::new();
    for obj in objects {
        let funcs = &obj.functions;
        own.push(funcs.iter().filter(|f| !earlier.contains(f.name.as_str())).collect());
        duplicated.extend(funcs.iter().map(|f| f.name.as_str()).filter(|n| earlier.contains(n)));
        earlier.extend(funcs.iter().map(|f| f.name.as_str()));
    }
    // Built when a ghost needs a block's start.
    let mut blocks: Option<Blocks<'_>> = None;
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
                at = match funcs[i + 1..].iter().find(|n| live.contains(&n.name)) {
                    Some(n) => position(strings, &format!(".text.{}", n.name)),
                    None => blocks.get_or_insert_with(|| Blocks::new(objects)).start(strings, o),
                };
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

    fn owned(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    fn kernel(n: &str) -> InputFunction {
        InputFunction { name: n.into(), is_kernel: true }
    }

    fn device(n: &str) -> InputFunction {
        InputFunction { name: n.into(), is_kernel: false }
    }

    fn object(functions: Vec<InputFunction>, names: &[&str]) -> InputObject {
        InputObject { functions, names: owned(names).into() }
    }

    fn live(v: &[&str]) -> HashSet<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn ghosts_follow_the_walk() {
        // nvlink on g1.o (k_dead2, k_live, k_dead1) and g2.o (k_live2, k_dead3, helper_live, helper_dead)
        let objects = vec![
            object(vec![kernel("k_dead2"), kernel("k_live"), kernel("k_dead1")], &[]),
            object(vec![kernel("k_live2"), kernel("k_dead3"), device("helper_live"), device("helper_dead")], &[]),
        ];
        let mut s = owned(&[
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
        ]);
        insert_ghosts(&mut s, &objects, &live(&["k_live", "k_live2", "helper_live"])).unwrap();
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
        let names = [".debug_frame", ".rela.debug_frame"];
        let a = object(vec![device("w"), kernel("ka")], &names);
        let b = object(vec![device("w"), kernel("kb")], &names);
        let c = object(vec![device("w"), kernel("kc")], &names);
        let live = live(&["w", "ka", "kc"]);
        let out = [".text.w", ".text.ka", ".rela.debug_frame", ".text.kc", ".rela.text.kc", ".nv.callgraph"];
        let mut s = owned(&out);
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
        let mut s = owned(&out);
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

    /// The head of nvlink's `.shstrtab` for sm_90.
    const HEAD: [&str; 9] = [
        "",
        ".shstrtab",
        ".strtab",
        ".symtab",
        ".symtab_shndx",
        ".note.nv.tkinfo",
        ".note.nv.cuinfo",
        ".nv.info",
        ".nv.compat",
    ];

    fn with_head(v: &[&str]) -> Vec<String> {
        owned(&HEAD).into_iter().chain(owned(v)).collect()
    }

    #[test]
    fn ghost_opens_a_block_of_names_other_than_functions() {
        // nvlink on -lineinfo objects a.o (ka, launched) and b.o (kb alone, dead):
        // kb's ghost comes before b.o's own `.nv_debug_ptx_txt.N`, not after it.
        let common = [
            ".shstrtab",
            ".strtab",
            ".symtab",
            ".debug_frame",
            ".debug_line",
            ".nv_debug_line_sass",
            ".rela.debug_line",
            ".rela.nv_debug_line_sass",
            ".rela.debug_frame",
        ];
        let a_names: Vec<&str> = common.iter().copied().chain([".nv_debug_ptx_txt.1097894412", ".nv.compat"]).collect();
        let b_names: Vec<&str> = common.iter().copied().chain([".nv_debug_ptx_txt.1163430418", ".nv.compat"]).collect();
        let a = object(vec![kernel("ka")], &a_names);
        let b = object(vec![kernel("kb")], &b_names);
        let mut s = with_head(&[
            ".text.ka",
            ".nv.info.ka",
            ".nv.shared.ka",
            ".debug_frame",
            ".debug_line",
            ".nv_debug_line_sass",
            ".nv_debug_ptx_txt.1097894412",
            ".nv.constant0.ka",
            ".rel.nv.constant0.ka",
            ".rela.debug_line",
            ".rela.nv_debug_line_sass",
            ".rela.debug_frame",
            ".nv_debug_ptx_txt.1163430418",
            ".nv.callgraph",
            ".nv.prototype",
            ".nv.rel.action",
        ]);
        insert_ghosts(&mut s, &[a.clone(), b.clone()], &live(&["ka"])).unwrap();
        let at = s.iter().position(|n| n == ".nv.shared.kb").unwrap();
        assert_eq!(s[at + 1], ".nv_debug_ptx_txt.1163430418");
        assert_eq!(s[at - 1], ".rela.debug_frame");

        // `b.o a.o`: kb's ghost opens the first block, right after the head.
        let mut s = with_head(&[
            ".debug_frame",
            ".debug_line",
            ".nv_debug_line_sass",
            ".nv_debug_ptx_txt.1163430418",
            ".rela.debug_line",
            ".rela.nv_debug_line_sass",
            ".rela.debug_frame",
            ".text.ka",
            ".nv.info.ka",
            ".nv.shared.ka",
            ".nv_debug_ptx_txt.1097894412",
            ".nv.constant0.ka",
            ".rel.nv.constant0.ka",
            ".nv.callgraph",
            ".nv.prototype",
            ".nv.rel.action",
        ]);
        insert_ghosts(&mut s, &[b, a], &live(&["ka"])).unwrap();
        assert_eq!(s[HEAD.len()], ".nv.shared.kb");
        assert_eq!(s[HEAD.len() + 1], ".debug_frame");
    }

    #[test]
    fn ghost_before_the_name_extern_shared_memory_makes() {
        // nvlink on a.o (ka) b.o (kb, dead, using `extern __shared__`) c.o (kc):
        // b.o's only name is the `.nv_debug.shared` nvlink makes for it.
        let common =
            [".shstrtab", ".strtab", ".symtab", ".debug_frame", ".rela.debug_frame", ".nv.compat", ".nv.callgraph"];
        let a = object(vec![kernel("ka")], &common);
        let b_names: Vec<&str> = common.iter().copied().chain([".nv_debug.shared"]).collect();
        let b = object(vec![kernel("kb")], &b_names);
        let c = object(vec![kernel("kc")], &common);
        let mut s = with_head(&[
            ".text.ka",
            ".nv.info.ka",
            ".nv.shared.ka",
            ".debug_frame",
            ".nv.constant0.ka",
            ".rel.nv.constant0.ka",
            ".rela.debug_frame",
            ".nv_debug.shared",
            ".text.kc",
            ".nv.info.kc",
            ".nv.shared.kc",
            ".nv.constant0.kc",
            ".rel.nv.constant0.kc",
            ".nv.callgraph",
            ".nv.prototype",
            ".nv.rel.action",
        ]);
        insert_ghosts(&mut s, &[a, b, c], &live(&["ka", "kc"])).unwrap();
        let at = s.iter().position(|n| n == ".nv.shared.kb").unwrap();
        assert_eq!(s[at - 1], ".rela.debug_frame");
        assert_eq!(s[at + 1], ".nv_debug.shared");
    }

    #[test]
    fn a_block_start_the_names_do_not_tell_is_refused() {
        // A name of no known object just before the next block (a renamed
        // local symbol: it may be b.o's): no anchor.
        let a = object(vec![kernel("ka")], &[".nv.global.init", "$str"]);
        let b = object(vec![kernel("kb")], &[".nv.global.init", "$str"]);
        let c = object(vec![kernel("kc")], &[]);
        let mut s = with_head(&[".text.ka", ".nv.global.init", "$str", "$str$1", ".text.kc", ".nv.callgraph"]);
        let err = insert_ghosts(&mut s, &[a.clone(), b.clone(), c.clone()], &live(&["ka", "kc"]));
        assert_eq!(err, Err(StrTabError::NoAnchor("kb".into())));
        // A name of an earlier object after the block's start: no anchor either.
        let mut s = with_head(&[".text.ka", ".text.kc", ".nv.global.init", ".nv.callgraph"]);
        let err = insert_ghosts(&mut s, &[a, b, c], &live(&["ka", "kc"]));
        assert_eq!(err, Err(StrTabError::NoAnchor("kb".into())));
    }
}
