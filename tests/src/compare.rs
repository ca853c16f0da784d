//! Comparing nvlinkd's outputs with nvlink's, with readable differences.

use std::collections::BTreeSet;

use nvlinkd_core::elf::{Elf, EM_CUDA};

use crate::run::Run;

/// How close an output file is to nvlink's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Same bytes.
    Identical,
    /// A cubin equal except for `.note.nv.tkinfo` (every other section, the
    /// symbol table and the program headers identical; file offsets may move).
    EqualExceptTkinfo,
    /// Anything else, with the differences.
    Differ(String),
}

fn is_cubin(b: &[u8]) -> bool {
    Elf::parse(b).map(|e| e.machine == EM_CUDA).unwrap_or(false)
}

/// Compare one output file.
pub fn file(expected: &[u8], actual: &[u8]) -> Verdict {
    if expected == actual {
        return Verdict::Identical;
    }
    if !(is_cubin(expected) && is_cubin(actual)) {
        return Verdict::Differ(format!("{} vs {} bytes, not cubins", expected.len(), actual.len()));
    }
    match cubin_diff(expected, actual) {
        d if d.is_empty() => Verdict::EqualExceptTkinfo,
        d => Verdict::Differ(d.join("\n")),
    }
}

/// Section-by-section differences, ignoring `.note.nv.tkinfo` and file offsets.
pub fn cubin_diff(expected: &[u8], actual: &[u8]) -> Vec<String> {
    let (Ok(a), Ok(b)) = (Elf::parse(expected), Elf::parse(actual)) else {
        return vec!["unparsable ELF".into()];
    };
    let mut d = Vec::new();
    if (a.e_type, a.machine, a.flags, a.abi_version, a.osabi) != (b.e_type, b.machine, b.flags, b.abi_version, b.osabi)
    {
        d.push(format!("ELF header: type/machine/flags {:?} vs {:?}", (a.e_type, a.flags), (b.e_type, b.flags)));
    }
    let names = |e: &Elf<'_>| e.sections.iter().map(|s| s.name.clone()).collect::<Vec<_>>();
    if names(&a) != names(&b) {
        let (na, nb): (BTreeSet<_>, BTreeSet<_>) = (names(&a).into_iter().collect(), names(&b).into_iter().collect());
        d.push(format!(
            "section lists differ ({} vs {}); only in nvlink: {:?}; only in nvlinkd: {:?}",
            a.sections.len(),
            b.sections.len(),
            na.difference(&nb).take(5).collect::<Vec<_>>(),
            nb.difference(&na).take(5).collect::<Vec<_>>()
        ));
        return d;
    }
    for (x, y) in a.sections.iter().zip(&b.sections) {
        if x.name == ".note.nv.tkinfo" {
            continue;
        }
        let fx = (x.sh_type, x.flags, x.addr, x.size, x.link, x.info, x.align, x.entsize);
        let fy = (y.sh_type, y.flags, y.addr, y.size, y.link, y.info, y.align, y.entsize);
        if fx != fy {
            d.push(format!("{}: header {:?} vs {:?}", x.name, fx, fy));
        } else if a.section_data(x) != b.section_data(y) {
            d.push(format!("{}: contents differ", x.name));
        }
    }
    match (a.symbols(), b.symbols()) {
        (Ok(sa), Ok(sb)) => {
            let key = |s: &nvlinkd_core::elf::Symbol| (s.name.clone(), s.info, s.other, s.shndx, s.value, s.size);
            if sa.iter().map(key).ne(sb.iter().map(key)) {
                d.push("symbol tables differ".into());
            }
        }
        _ => d.push("unreadable symbol table".into()),
    }
    let ph = |e: &Elf<'_>| {
        e.segments.iter().map(|p| (p.p_type, p.flags, p.vaddr, p.paddr, p.memsz, p.align)).collect::<Vec<_>>()
    };
    if ph(&a) != ph(&b) {
        d.push("program headers differ".into());
    }
    d
}

/// A whole-invocation comparison: status, streams, files.
#[derive(Clone, Debug)]
pub struct Comparison {
    pub problems: Vec<String>,
    /// Every output file byte-identical.
    pub identical: bool,
}

pub fn runs(expected: &Run, actual: &Run) -> Comparison {
    let mut problems = Vec::new();
    if expected.code != actual.code {
        problems.push(format!("exit status {} vs {}", expected.code, actual.code));
    }
    if expected.stdout != actual.stdout {
        problems.push(format!(
            "stdout differs:\n--- nvlink\n{}\n--- nvlinkd\n{}",
            String::from_utf8_lossy(&expected.stdout),
            String::from_utf8_lossy(&actual.stdout)
        ));
    }
    if expected.stderr != actual.stderr {
        problems.push(format!(
            "stderr differs:\n--- nvlink\n{}\n--- nvlinkd\n{}",
            String::from_utf8_lossy(&expected.stderr),
            String::from_utf8_lossy(&actual.stderr)
        ));
    }
    let names: BTreeSet<&String> = expected.files.keys().chain(actual.files.keys()).collect();
    let mut identical = true;
    for n in names {
        match (expected.files.get(n), actual.files.get(n)) {
            (Some(e), Some(a)) => match file(e, a) {
                Verdict::Identical => {}
                Verdict::EqualExceptTkinfo => identical = false,
                Verdict::Differ(why) => {
                    identical = false;
                    problems.push(format!("{n}: {why}"));
                }
            },
            (Some(_), None) => problems.push(format!("{n}: written by nvlink, not by nvlinkd")),
            (None, Some(_)) => problems.push(format!("{n}: written by nvlinkd, not by nvlink")),
            (None, None) => {}
        }
    }
    Comparison { identical: identical && problems.is_empty(), problems }
}
