//! Damaged host objects get nvlink's answer: copies of an object nvcc made,
//! each with one field of its ELF headers or relocations changed, linked by
//! the real nvlink and through a daemon (`--verify=off`, so the answer
//! compared is the daemon's own). The damage is the kind measured in
//! `core/src/input/host.rs` (`refused`) and `core/src/elf.rs`
//! (`Elf::parse_host`): what nvlink's host-object reader refuses ("Could not
//! find fatbin") and what it takes although a strict ELF reader would not.

use nvlinkd_tests::compare;
use nvlinkd_tests::corpus;
use nvlinkd_tests::daemon::Daemon;
use nvlinkd_tests::env::{real_nvlink, shim, TempDir};
use nvlinkd_tests::run::{run, Invocation};

const EHDR_SHOFF: usize = 0x28;
const EHDR_SHENTSIZE: usize = 0x3a;
const EHDR_SHSTRNDX: usize = 0x3e;

/// A section header's fields, by offset in the 64-byte header.
const SH_NAME: usize = 0x00;
const SH_TYPE: usize = 0x04;
const SH_OFFSET: usize = 0x18;
const SH_SIZE: usize = 0x20;
const SH_LINK: usize = 0x28;
const SH_ENTSIZE: usize = 0x38;

const SHT_PROGBITS: u64 = 1;
const SHT_SYMTAB: u32 = 2;
const SHT_RELA: u32 = 4;
const SHT_NOBITS: u32 = 8;

struct Section {
    header: usize,
    name: String,
    sh_type: u32,
    offset: usize,
    size: usize,
    link: u32,
}

fn u16_at(b: &[u8], at: usize) -> usize {
    u16::from_le_bytes([b[at], b[at + 1]]) as usize
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}
fn u64_at(b: &[u8], at: usize) -> usize {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap()) as usize
}

/// The sections of a well-formed 64-bit little-endian ELF file.
fn sections(b: &[u8]) -> Vec<Section> {
    let (shoff, entsize) = (u64_at(b, EHDR_SHOFF), u16_at(b, EHDR_SHENTSIZE));
    let count = u16_at(b, EHDR_SHENTSIZE + 2);
    let names = u64_at(b, shoff + u16_at(b, EHDR_SHSTRNDX) * entsize + SH_OFFSET);
    (0..count)
        .map(|i| {
            let header = shoff + i * entsize;
            let at = names + u32_at(b, header + SH_NAME) as usize;
            let end = at + b[at..].iter().position(|&c| c == 0).unwrap();
            Section {
                header,
                name: String::from_utf8_lossy(&b[at..end]).into_owned(),
                sh_type: u32_at(b, header + SH_TYPE),
                offset: u64_at(b, header + SH_OFFSET),
                size: u64_at(b, header + SH_SIZE),
                link: u32_at(b, header + SH_LINK),
            }
        })
        .collect()
}

/// `b` with the `width`-byte little-endian field at `at` set to `value`.
fn with(b: &[u8], at: usize, width: usize, value: u64) -> Vec<u8> {
    let mut b = b.to_vec();
    b[at..at + width].copy_from_slice(&value.to_le_bytes()[..width]);
    b
}

/// The damaged copies of host object `b`, named.
fn damaged(b: &[u8]) -> Vec<(String, Vec<u8>)> {
    let secs = sections(b);
    let count = secs.len() as u64;
    let symtab = secs.iter().position(|s| s.sh_type == SHT_SYMTAB).expect("a symbol table");
    let symbols = (secs[symtab].size / 24) as u64;
    let shstrtab = u16_at(b, EHDR_SHSTRNDX);
    let shoff = u64_at(b, EHDR_SHOFF);
    let fatbin = b.windows(4).position(|w| w == [0x50, 0xed, 0x55, 0xba]).expect("a fatbin in the object");
    let mut out = vec![
        ("EI_VERSION 0".to_owned(), with(b, 6, 1, 0)),
        ("e_type ET_EXEC".to_owned(), with(b, 0x10, 2, 2)),
        ("e_type ET_DYN".to_owned(), with(b, 0x10, 2, 3)),
        ("e_type 0x4242".to_owned(), with(b, 0x10, 2, 0x4242)),
        // Program headers, which no relocatable object has.
        ("e_phnum 1".to_owned(), with(b, 0x38, 2, 1)),
        ("e_phnum 0xffff".to_owned(), with(b, 0x38, 2, 0xffff)),
        ("e_phoff past the end".to_owned(), with(b, 0x20, 8, b.len() as u64 + 1)),
        ("e_phoff in the section headers".to_owned(), with(b, 0x20, 8, b.len() as u64 - 8)),
        ("e_phoff 64".to_owned(), with(b, 0x20, 8, 64)),
        // The fatbin's own headers: a container version nvlink does not
        // know, a member arch with high bits set.
        ("fatbin version 2".to_owned(), with(b, fatbin + 4, 2, 2)),
        ("fatbin member arch 0x205a".to_owned(), with(b, fatbin + 16 + 28, 4, 0x205a)),
        ("fatbin member flags 0x9011".to_owned(), with(b, fatbin + 16 + 40, 8, 0x9011)),
        // Section 0, which is null.
        ("section 0 SHT_SYMTAB".to_owned(), with(b, shoff + SH_TYPE, 4, SHT_SYMTAB as u64)),
        ("section 0 sized".to_owned(), with(b, shoff + SH_SIZE, 8, 24)),
    ];
    let mut add = |what: String, bytes: Vec<u8>| out.push((what, bytes));
    for (i, s) in secs.iter().enumerate().skip(1) {
        let n = &s.name;
        add(format!("{n}: name past the string table"), with(b, s.header + SH_NAME, 4, 0xf_ffff));
        if s.sh_type == SHT_RELA {
            for link in [0, count + 9, u64::from(s.link) + 1] {
                add(format!("{n}: sh_link {link}"), with(b, s.header + SH_LINK, 4, link));
            }
            for entsize in [0, 7, 25, 48] {
                add(format!("{n}: sh_entsize {entsize}"), with(b, s.header + SH_ENTSIZE, 8, entsize));
            }
            if s.size >= 24 {
                // The first relocation's symbol: the last one, then one past it.
                for sym in [symbols - 1, symbols, 1000] {
                    add(format!("{n}: symbol {sym} of {symbols}"), with(b, s.offset + 12, 4, sym));
                }
                add(format!("{n}: type 0xff"), with(b, s.offset + 8, 4, 0xff));
            }
        }
        if i == symtab {
            for entsize in [0, 7, 48] {
                add(format!("{n}: sh_entsize {entsize}"), with(b, s.header + SH_ENTSIZE, 8, entsize));
            }
            add(format!("{n}: SHT_PROGBITS"), with(b, s.header + SH_TYPE, 4, SHT_PROGBITS));
        }
        if s.name == ".comment" {
            // A second symbol table, of entry size 0.
            let typed = with(b, s.header + SH_TYPE, 4, u64::from(SHT_SYMTAB));
            add(format!("{n}: SHT_SYMTAB, entry size 0"), with(&typed, s.header + SH_ENTSIZE, 8, 0));
        }
        if i == shstrtab {
            add(format!("{n}: SHT_PROGBITS"), with(b, s.header + SH_TYPE, 4, SHT_PROGBITS));
        }
        // An offset past the end: nvlink checks it, but not a NOBITS section's.
        if s.size == 0 || s.sh_type == SHT_NOBITS {
            add(format!("{n}: offset past the end"), with(b, s.header + SH_OFFSET, 8, b.len() as u64 + 4096));
        }
    }
    out
}

#[test]
fn damaged_host_objects_get_nvlinks_answer() {
    let object = std::fs::read(corpus::dir().join("accumulate.o")).expect("the corpus object");
    let cases = damaged(&object);
    assert!(cases.len() > 80, "{} cases", cases.len());
    let d = Daemon::start_with(&["--verify=off"]);
    let mut env = d.shim_env();
    env.push(("NVLINKD_FALLBACK".into(), "never".into()));
    let cwd = TempDir::new("damaged");
    std::fs::copy(corpus::dir().join("scale.o"), cwd.path().join("scale.o")).unwrap();
    let mut differing = Vec::new();
    let (mut refused, mut linked) = (0, 0);
    for (what, bytes) in &cases {
        std::fs::write(cwd.path().join("m.o"), bytes).unwrap();
        // Named, and as an archive's member.
        let _ = std::fs::remove_file(cwd.path().join("libm.a"));
        let ar = std::process::Command::new("ar").args(["rcs", "libm.a", "m.o"]).current_dir(cwd.path()).status();
        assert!(ar.unwrap().success());
        for (how, args) in [("", "--arch=sm_90 m.o scale.o"), (" (archive member)", "--arch=sm_90 libm.a scale.o")] {
            let out = TempDir::new("damaged-out");
            let link = Invocation::templated(&format!("{args} -o {{OUT}}/out.cubin"), cwd.path(), &out);
            let expected = run(&real_nvlink(), &link, &[]);
            let actual = run(&shim(), &link, &env);
            let cmp = compare::runs(&expected, &actual);
            if !(cmp.problems.is_empty() && cmp.identical) {
                differing.push(format!("{what}{how}: {:?}", cmp.problems));
            }
            if expected.code == 0 {
                linked += 1;
            } else {
                refused += 1;
            }
        }
    }
    eprintln!(
        "damaged host objects: {} cases, named and in an archive: nvlink linked {linked}, refused {refused}",
        cases.len()
    );
    assert!(linked > 0 && refused > 0, "the damage no longer tells nvlink's reader's rules apart");
    assert!(differing.is_empty(), "{} of {} differ:\n{}", differing.len(), 2 * cases.len(), differing.join("\n"));
}

/// The symbol table's entry named `name`: its offset in the file.
fn symbol_at(b: &[u8], secs: &[Section], name: &str) -> usize {
    let symtab = secs.iter().find(|s| s.sh_type == SHT_SYMTAB).expect("a symbol table");
    let strtab = &secs[symtab.link as usize];
    (0..symtab.size / 24)
        .map(|i| symtab.offset + i * 24)
        .find(|&at| {
            let from = strtab.offset + u32_at(b, at) as usize;
            b[from..].split(|&c| c == 0).next() == Some(name.as_bytes())
        })
        .unwrap_or_else(|| panic!("no symbol {name}"))
}

/// Damaged copies of a device cubin ptxas wrote: each kind measured to give
/// another answer in process than nvlink's before unusual cubins were left to
/// it (`core/src/input/canonical.rs`), and nvlink's answer the same run after
/// run (nvlink reads some damage, a name past its table, from memory that
/// differs between runs).
fn damaged_cubin(b: &[u8]) -> Vec<(String, Vec<u8>)> {
    let secs = sections(b);
    let by_name = |n: &str| secs.iter().find(|s| s.name == n).unwrap_or_else(|| panic!("no section {n}"));
    let text = by_name(".text._Z5scalef");
    let rela = by_name(".rela.debug_frame");
    let tkinfo = by_name(".note.nv.tkinfo");
    let info = by_name(".nv.info._Z5scalef");
    let shstrtab = &secs[u16_at(b, EHDR_SHSTRNDX)];
    let uft = symbol_at(b, &secs, "__UFT_CANONICAL");
    let udt = symbol_at(b, &secs, "__UDT_CANONICAL");
    // A note's descriptor follows its 12-byte header and 4-aligned owner name.
    let desc = tkinfo.offset + 12 + (u32_at(b, tkinfo.offset) as usize).div_ceil(4) * 4;
    vec![
        ("EI_VERSION 2".to_owned(), with(b, 6, 1, 2)),
        ("EI_DATA 0xff".to_owned(), with(b, 5, 1, 0xff)),
        (".shstrtab: name one further".to_owned(), with(b, shstrtab.header + SH_NAME, 4, 0xa80)),
        (".nv.compat: name one further".to_owned(), {
            let compat = by_name(".nv.compat");
            with(b, compat.header + SH_NAME, 4, u64::from(u32_at(b, compat.header + SH_NAME)) + 1)
        }),
        (".text: sh_info another symbol".to_owned(), with(b, text.header + 0x2c, 4, 0x2587_6d99)),
        (".text: sh_entsize 0xff".to_owned(), with(b, text.header + SH_ENTSIZE, 8, 0xff)),
        (".nv.info._Z5scalef: SHT_STRTAB".to_owned(), with(b, info.header + SH_TYPE, 4, 3)),
        ("__UFT_CANONICAL: size 16".to_owned(), with(b, uft + 16, 8, 16)),
        ("__UDT_CANONICAL: st_other 0x80".to_owned(), with(b, udt + 5, 1, 0x80)),
        (".rela.debug_frame: type 0xff".to_owned(), with(b, rela.offset + 8, 4, 0xff)),
        (".rela.debug_frame: symbol 1".to_owned(), with(b, rela.offset + 24 + 12, 4, 1)),
        ("tkinfo: an offset moved".to_owned(), with(b, desc + 8, 4, u64::from(u32_at(b, desc + 8)) + 1)),
        // A prototype string from inside another ("Prototype doesn't match").
        (".nv.prototype: an offset inside a string".to_owned(), {
            let proto = by_name(".nv.prototype");
            with(b, proto.offset + 4, 4, u64::from(u32_at(b, proto.offset + 4)) + 1)
        }),
        (".nv.callgraph: a caller that is no function".to_owned(), with(b, by_name(".nv.callgraph").offset, 4, 1)),
    ]
}

#[test]
fn damaged_cubins_get_nvlinks_answer() {
    let cubin = std::fs::read(corpus::dir().join("scale.cubin")).expect("the corpus cubin");
    let d = Daemon::start_with(&["--verify=off"]);
    let mut env = d.shim_env();
    // nvlink crashes on some (SIGSEGV): the daemon leaves such a link to the
    // shim, whose own nvlink then crashes as the caller's would.
    env.push(("NVLINKD_FALLBACK".into(), "auto".into()));
    let cwd = TempDir::new("damaged-cubin");
    std::fs::copy(corpus::dir().join("accumulate.o"), cwd.path().join("accumulate.o")).unwrap();
    let mut differing = Vec::new();
    let cases = damaged_cubin(&cubin);
    for (what, bytes) in &cases {
        std::fs::write(cwd.path().join("m.cubin"), bytes).unwrap();
        let out = TempDir::new("damaged-cubin-out");
        let link = Invocation::templated("--arch=sm_90 m.cubin accumulate.o -o {OUT}/out.cubin", cwd.path(), &out);
        let expected = run(&real_nvlink(), &link, &[]);
        let actual = run(&shim(), &link, &env);
        let cmp = compare::runs(&expected, &actual);
        if !(cmp.problems.is_empty() && cmp.identical) {
            differing.push(format!("{what}: {:?}", cmp.problems));
        }
    }
    assert!(differing.is_empty(), "{} of {} differ:\n{}", differing.len(), cases.len(), differing.join("\n"));
}

/// The other side of [`damaged_cubins_get_nvlinks_answer`]: every cubin nvcc
/// and ptxas wrote for the corpus, and every one in libcudadevrt, has the
/// shape linked in process (none is left to nvlink for looking damaged);
/// `NVLINKD_CUBIN_LIST` names a file listing more cubins to check.
#[test]
fn every_cubin_the_toolkit_writes_has_the_shape_linked_in_process() {
    let work = TempDir::new("canonical");
    let cuobjdump = nvlinkd_tests::env::cuda_home().join("bin/cuobjdump");
    let lib = nvlinkd_tests::env::cuda_home().join("lib/libcudadevrt.a");
    let mut inputs: Vec<std::path::PathBuf> = std::fs::read_dir(corpus::dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "o" || x == "a"))
        .collect();
    inputs.push(lib);
    let mut cubins = Vec::new();
    for (i, input) in inputs.iter().enumerate() {
        let dir = work.path().join(i.to_string());
        std::fs::create_dir(&dir).unwrap();
        // Inputs without device code (host objects, LTO or PTX only) extract nothing.
        let _ = std::process::Command::new(&cuobjdump).arg("-xelf").arg("all").arg(input).current_dir(&dir).output();
        cubins.extend(std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()));
    }
    cubins.extend(
        std::fs::read_dir(corpus::dir())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "cubin")),
    );
    // More cubins to check (a soak's own builds): one path per line.
    if let Ok(list) = std::env::var("NVLINKD_CUBIN_LIST") {
        cubins.extend(std::fs::read_to_string(list).unwrap().lines().map(std::path::PathBuf::from));
    }
    let unusual: Vec<String> = cubins
        .iter()
        .filter_map(|c| {
            let why = nvlinkd_core::input::cubin::unusual(&std::fs::read(c).unwrap())?;
            Some(format!("{}: {why}", c.display()))
        })
        .collect();
    eprintln!("{} cubins", cubins.len());
    assert!(cubins.len() > 100, "only {} cubins extracted", cubins.len());
    assert!(unusual.is_empty(), "{}", unusual.join("\n"));
}
