//! A generative corpus: small CUDA programs made from a seed, compiled with the
//! real nvcc and device-linked the ways nvcc and users link them, for parity
//! tests beyond the hand-written corpus (`tests/tests/generated.rs`).
//!
//! [`program`] turns a `u64` seed into 1–4 `.cu` units (splitmix64, no other
//! randomness: one seed, one program, on every machine) combining, at random,
//! features whose snippets each compile on their own: static and dynamic
//! (`extern __shared__`, launched with a size) shared memory, dynamic
//! parallelism, cooperative groups (tiles, block and grid sync), tables of
//! device function pointers, `__device__`/`__constant__`/`__managed__`
//! variables (some written by the host, so that the host references them),
//! templates instantiated in two units, device `printf`/`assert`/`malloc`,
//! atomics, a line of inline PTX, `__launch_bounds__`, weak and `extern "C"`
//! device functions, cross-unit `extern __device__` calls (to a
//! `__forceinline__` function in LTO-only programs, where that links), and
//! kernels no host code launches.
//!
//! Each program is compiled per [`Mode`] (`-dc`, plus one of `-dlto`, `-G`,
//! `-lineinfo`, two archs for some; `-dlto` alone for a few) and comes with a
//! short list of [`Link`]s: nvcc's device link line, the units after the
//! first in a static library, the first unit as LTO IR beside the others' SASS
//! (partial LTO), `-r`. [`compile`] builds the objects once per set of sources
//! and toolkit, under the target dir (as the hand-written corpus is), in
//! parallel.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::env::{bin_dir, cuda_home};

/// splitmix64: small, fast, and the same everywhere.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
    /// True with probability `percent`/100.
    pub fn chance(&mut self, percent: u32) -> bool {
        self.next_u64() % 100 < u64::from(percent)
    }
}

/// How the units are compiled (each mode: one object per unit, `u<i><suffix>.o`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `nvcc -arch=sm_90 -dc`.
    Rdc,
    /// `-dlto` (LTO IR and a PTX copy).
    Lto,
    /// `-G` (device debug; linked with `-g`, as nvcc does).
    Debug,
    /// `-lineinfo`.
    LineInfo,
    /// SASS for sm_80 and sm_90 in one object.
    TwoArch,
}

impl Mode {
    pub fn suffix(self) -> &'static str {
        match self {
            Mode::Rdc => "",
            Mode::Lto => "_lto",
            Mode::Debug => "_g",
            Mode::LineInfo => "_li",
            Mode::TwoArch => "_2a",
        }
    }
    pub fn nvcc_flags(self) -> &'static [&'static str] {
        match self {
            Mode::Rdc => &["-arch=sm_90"],
            Mode::Lto => &["-arch=sm_90", "-dlto"],
            Mode::Debug => &["-arch=sm_90", "-G"],
            Mode::LineInfo => &["-arch=sm_90", "-lineinfo"],
            Mode::TwoArch => &["-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90"],
        }
    }
}

/// One `.cu` unit.
#[derive(Clone, Debug)]
pub struct Unit {
    /// `u0.cu`, `u1.cu`...
    pub name: String,
    pub source: String,
}

/// A device link of a program's objects: arguments as in
/// [`crate::run::Invocation::templated`] (`{OUT}`, `{L}`, `{NVVM}`), run in
/// the program's build directory.
#[derive(Clone, Debug)]
pub struct Link {
    /// Short name of the variant, e.g. `nvcc-lto`, `archive`, `relocatable`.
    pub name: String,
    pub args: String,
}

#[derive(Clone, Debug)]
pub struct Program {
    pub seed: u64,
    pub units: Vec<Unit>,
    /// The modes compiled: [`Mode::Rdc`] and maybe one more, or [`Mode::Lto`] alone.
    pub modes: Vec<Mode>,
    pub links: Vec<Link>,
}

impl Program {
    /// Object file names of `mode`, first unit first.
    pub fn objects(&self, mode: Mode) -> Vec<String> {
        (0..self.units.len()).map(|i| format!("u{i}{}.o", mode.suffix())).collect()
    }
}

/// Which features a unit has (decided before any source is written, since
/// units refer to each other's).
#[derive(Clone, Default)]
struct Plan {
    template: bool,
    weak: bool,
    weak_body: u32,
    cross: bool,
    forceinline: bool,
    externc: bool,
    vars: bool,
    host_writes_vars: bool,
    managed: bool,
    fnptr: bool,
    cdp: bool,
    host_launches_child: bool,
    cg: bool,
    grid_sync: bool,
    static_shared: bool,
    dyn_shared: bool,
    atomics: bool,
    ptx: bool,
    printf: bool,
    assert: bool,
    malloc: bool,
    launch_bounds: bool,
    dead: bool,
    kernels: usize,
    /// Units whose `xf_<u>`/`fi_<u>` this unit calls.
    calls_cross: Vec<usize>,
    calls_forceinline: Vec<usize>,
}

/// The program of `seed`.
pub fn program(seed: u64) -> Program {
    let mut r = Rng::new(seed);
    let n = 1 + r.below(4);
    let mut plans: Vec<Plan> = (0..n)
        .map(|_| Plan {
            cross: r.chance(50),
            forceinline: r.chance(15),
            externc: r.chance(25),
            vars: r.chance(45),
            host_writes_vars: r.chance(60),
            managed: r.chance(30),
            fnptr: r.chance(25),
            cdp: r.chance(25),
            host_launches_child: r.chance(25),
            cg: r.chance(30),
            grid_sync: r.chance(35),
            static_shared: r.chance(35),
            dyn_shared: r.chance(30),
            atomics: r.chance(40),
            ptx: r.chance(25),
            printf: r.chance(20),
            assert: r.chance(15),
            malloc: r.chance(15),
            launch_bounds: r.chance(25),
            dead: r.chance(35),
            kernels: 1 + r.below(3),
            weak_body: r.below(3) as u32,
            ..Plan::default()
        })
        .collect();
    // Templates and weak functions: in two units where there are two.
    if r.chance(40) {
        for u in two_units(&mut r, n) {
            plans[u].template = true;
        }
    }
    if r.chance(35) {
        for u in two_units(&mut r, n) {
            plans[u].weak = true;
        }
    }
    // The compile modes: -dc, and at random one more. Some LTO programs are
    // LTO alone, as `nvcc -dlto` builds them: only there may other units call
    // a __forceinline__ function (nvcc -dc emits no symbol for it, so that
    // without LTO the link fails with an undefined reference).
    let extra = r.chance(75).then(|| [Mode::Lto, Mode::Lto, Mode::Debug, Mode::LineInfo, Mode::TwoArch][r.below(5)]);
    let lto_only = extra == Some(Mode::Lto) && r.chance(50);
    let modes = match extra {
        _ if lto_only => vec![Mode::Lto],
        Some(m) => vec![Mode::Rdc, m],
        None => vec![Mode::Rdc],
    };
    // Callers of each exported function, in its own unit and in others.
    for u in 0..n {
        for v in 0..n {
            if plans[u].cross && r.chance(60) {
                plans[v].calls_cross.push(u);
            }
            if plans[u].forceinline && (v == u || lto_only) && r.chance(70) {
                plans[v].calls_forceinline.push(u);
            }
        }
    }
    // Nor does nvcc -dlto emit one that its own unit does not call: other
    // units call it only where its own does (else an undefined reference).
    let self_calls: Vec<bool> = (0..n).map(|u| plans[u].calls_forceinline.contains(&u)).collect();
    for (v, plan) in plans.iter_mut().enumerate() {
        plan.calls_forceinline.retain(|&u| u == v || self_calls[u]);
    }
    let units =
        (0..n).map(|u| Unit { name: format!("u{u}.cu"), source: unit_source(&mut r, u, n, &plans[u]) }).collect();

    let mut p = Program { seed, units, modes, links: Vec::new() };
    p.links = links(&mut r, &p);
    p
}

/// One unit, or two distinct ones when the program has two or more.
fn two_units(r: &mut Rng, n: usize) -> Vec<usize> {
    let a = r.below(n);
    if n == 1 {
        return vec![a];
    }
    let b = (a + 1 + r.below(n - 1)) % n;
    vec![a, b]
}

const NVCC_LINE: &str = "-m64 --arch={ARCH} --register-link-binaries={OUT}/reg.c{G} -L{L}/stubs -L{L} -cpu-arch=X86_64";

fn links(r: &mut Rng, p: &Program) -> Vec<Link> {
    let mut links = Vec::new();
    let n = p.units.len();
    for &mode in &p.modes {
        let objs = p.objects(mode);
        let archs: &[&str] = if mode == Mode::TwoArch { &["sm_80", "sm_90"] } else { &["sm_90"] };
        let g = if mode == Mode::Debug { " -g" } else { "" };
        let mut extra = String::new();
        if mode == Mode::TwoArch {
            extra.push_str(" -report-arch");
        }
        if mode == Mode::Lto {
            extra.push_str(" -dlto -nvvmpath={NVVM}");
        }
        let tag = match mode {
            Mode::Rdc => "nvcc".to_string(),
            m => format!("nvcc{}", m.suffix().replace('_', "-")),
        };
        for arch in archs {
            let head = NVCC_LINE.replace("{ARCH}", arch).replace("{G}", g);
            let name = if archs.len() > 1 { format!("{tag}-{arch}") } else { tag.clone() };
            links.push(Link {
                name,
                args: format!("{head}{extra} {} -lcudadevrt -o {{OUT}}/out.cubin", objs.join(" ")),
            });
        }
        let archive_chance = if mode == Mode::Rdc { 60 } else { 30 };
        if n >= 2 && r.chance(archive_chance) {
            let arch = archs[r.below(archs.len())];
            let head = NVCC_LINE.replace("{ARCH}", arch).replace("{G}", g);
            links.push(Link {
                name: format!("{tag}-archive"),
                args: format!(
                    "{head}{extra} {} -Llib -lgen{} -lcudadevrt -o {{OUT}}/out.cubin",
                    objs[0],
                    mode.suffix()
                ),
            });
        }
        // Partial LTO: the first unit as LTO IR beside the others' SASS.
        if mode == Mode::Lto && n >= 2 && p.modes.contains(&Mode::Rdc) && r.chance(30) {
            let head = NVCC_LINE.replace("{ARCH}", "sm_90").replace("{G}", "");
            let rest = p.objects(Mode::Rdc)[1..].join(" ");
            links.push(Link {
                name: format!("{tag}-partial"),
                args: format!("{head}{extra} {} {rest} -lcudadevrt -o {{OUT}}/out.cubin", objs[0]),
            });
        }
        let reloc_chance = match mode {
            Mode::Rdc => 40,
            Mode::Lto | Mode::TwoArch => 35,
            _ => 20,
        };
        if r.chance(reloc_chance) {
            let arch = archs[0];
            let lto = if mode == Mode::Lto { " -dlto -nvvmpath={NVVM}" } else { "" };
            links.push(Link {
                name: format!("{tag}-relocatable"),
                args: format!("--arch={arch}{g} -r{lto} {} -o {{OUT}}/out.o", objs.join(" ")),
            });
        }
    }
    links
}

/// The source of unit `u` of `n`.
fn unit_source(r: &mut Rng, u: usize, n: usize, p: &Plan) -> String {
    let mut top = String::new(); // includes and declarations
    let mut defs = String::new(); // device definitions
    let mut host = String::new(); // host launcher body
    top.push_str(&format!("// generated unit {u} of {n}\n#include <cstdio>\n"));
    if p.assert {
        top.push_str("#include <cassert>\n");
    }
    if p.cg {
        top.push_str("#include <cooperative_groups.h>\nnamespace cg = cooperative_groups;\n");
    }
    top.push('\n');
    // Kernel bodies: each feature's lines go to one kernel.
    let k = p.kernels;
    let mut bodies: Vec<String> = vec![String::new(); k];
    let mut dyn_smem = vec![false; k];
    let pick = |r: &mut Rng| r.below(k);

    if p.template {
        defs.push_str(
            "template <typename T> __device__ T tadd(T a, T b) { return a + b; }\n\
             template <typename T> __global__ void tk(T *out, int n) {\n  if ((int)threadIdx.x < n) out[threadIdx.x] = tadd<T>(out[threadIdx.x], (T)1);\n}\n",
        );
        host.push_str("  tk<int><<<1, 32>>>(d, 32);\n");
        let i = pick(r);
        bodies[i].push_str("  x = tadd<int>(x, 2);\n");
    }
    if p.weak {
        let _ = writeln!(defs, "__device__ __attribute__((weak)) int wfn(int x) {{ return x * 3 + {}; }}", p.weak_body);
        let i = pick(r);
        bodies[i].push_str("  x = wfn(x);\n");
    }
    if p.cross {
        let _ = writeln!(defs, "__device__ int xf_{u}(int x) {{ return x + {}; }}", 7 + u);
    }
    for &v in &p.calls_cross {
        if v != u {
            let _ = writeln!(top, "extern __device__ int xf_{v}(int x);");
        }
        let i = pick(r);
        let _ = writeln!(bodies[i], "  x = xf_{v}(x);");
    }
    if p.forceinline {
        let _ = writeln!(defs, "__device__ __forceinline__ int fi_{u}(int x) {{ return x * 5 + {u}; }}");
    }
    for &v in &p.calls_forceinline {
        if v != u {
            let _ = writeln!(top, "extern __device__ int fi_{v}(int x);");
        }
        let i = pick(r);
        let _ = writeln!(bodies[i], "  x = fi_{v}(x);");
    }
    if p.externc {
        let _ = writeln!(defs, "extern \"C\" __device__ int cfn_{u}(int x) {{ return x ^ 0x55; }}");
        let i = pick(r);
        let _ = writeln!(bodies[i], "  x = cfn_{u}(x);");
    }
    if p.vars {
        let _ = writeln!(defs, "__device__ int gv_{u};\n__constant__ int cv_{u}[4];");
        if p.managed {
            let _ = writeln!(defs, "__managed__ int mv_{u};");
        }
        let i = pick(r);
        let _ = writeln!(bodies[i], "  x += gv_{u} + cv_{u}[x & 3];");
        if p.managed {
            let _ = writeln!(bodies[i], "  x += mv_{u};");
            host.push_str(&format!("  mv_{u} = 3;\n"));
        }
        if p.host_writes_vars {
            let _ = writeln!(
                host,
                "  {{ int h[4] = {{1, 2, 3, 4}}; cudaMemcpyToSymbol(gv_{u}, h, sizeof(int)); cudaMemcpyToSymbol(cv_{u}, h, sizeof(h)); }}"
            );
        }
    }
    if p.fnptr {
        let _ = writeln!(
            defs,
            "__device__ int op0_{u}(int x) {{ return x + 1; }}\n__device__ int op1_{u}(int x) {{ return x * 2; }}\n\
             typedef int (*op_t_{u})(int);\n__device__ op_t_{u} ops_{u}[2] = {{op0_{u}, op1_{u}}};"
        );
        let i = pick(r);
        let _ = writeln!(bodies[i], "  x = ops_{u}[x & 1](x);");
    }
    if p.cdp {
        let _ = writeln!(defs, "__global__ void child_{u}(int *out) {{ out[threadIdx.x] += 1; }}");
        let i = pick(r);
        let _ = writeln!(bodies[i], "  if (threadIdx.x == 0) child_{u}<<<1, 32>>>(out);");
        if p.host_launches_child {
            let _ = writeln!(host, "  child_{u}<<<1, 32>>>(d);");
        }
    }
    if p.cg {
        let i = pick(r);
        bodies[i].push_str(
            "  { cg::thread_block b = cg::this_thread_block(); cg::thread_block_tile<32> t = cg::tiled_partition<32>(b);\n    x += t.shfl_down(x, 1); t.sync(); b.sync(); }\n",
        );
        if p.grid_sync {
            let i = pick(r);
            bodies[i].push_str("  { cg::grid_group g = cg::this_grid(); g.sync(); }\n");
        }
    }
    if p.static_shared {
        let i = pick(r);
        let size = [32, 64, 100, 256][r.below(4)];
        let _ = writeln!(
            bodies[i],
            "  {{ __shared__ int sbuf[{size}]; sbuf[threadIdx.x % {size}] = x; __syncthreads(); x += sbuf[(threadIdx.x + 1) % {size}]; }}"
        );
    }
    if p.dyn_shared {
        let i = pick(r);
        dyn_smem[i] = true;
        bodies[i].push_str(
            "  { extern __shared__ int dsm[]; dsm[threadIdx.x] = x; __syncthreads(); x += dsm[(threadIdx.x + 3) % blockDim.x]; }\n",
        );
    }
    if p.atomics {
        let i = pick(r);
        bodies[i].push_str("  atomicAdd(out, x); atomicCAS(out + 1, 0, x); atomicMax(out + 2, x);\n");
    }
    if p.ptx {
        let i = pick(r);
        bodies[i].push_str("  { unsigned lane; asm(\"mov.u32 %0, %%laneid;\" : \"=r\"(lane)); x += (int)lane; }\n");
    }
    if p.printf {
        let i = pick(r);
        let _ = writeln!(bodies[i], "  if (x == 12345) printf(\"unit {u}: %d\\n\", x);");
    }
    if p.assert {
        let i = pick(r);
        bodies[i].push_str("  assert(n >= 0);\n");
    }
    if p.malloc {
        let i = pick(r);
        bodies[i].push_str("  { int *p = (int *)malloc(4 * sizeof(int)); if (p) { p[0] = x; x = p[0]; free(p); } }\n");
    }

    // The kernels: the first launched by the host (mostly), the others at random.
    let first_launched = r.chance(85);
    let mut kernels = String::new();
    for (i, body) in bodies.iter().enumerate() {
        let bounds = if p.launch_bounds && i == 0 { "__launch_bounds__(128, 2) " } else { "" };
        let _ = writeln!(
            kernels,
            "__global__ void {bounds}k{u}_{i}(int *out, int n) {{\n  int x = threadIdx.x + n;\n{body}  if ((int)threadIdx.x < n) out[threadIdx.x] = x;\n}}"
        );
        if (i == 0 && first_launched) || (i > 0 && r.chance(60)) {
            let smem = if dyn_smem[i] { ", 32 * sizeof(int)" } else { "" };
            let _ = writeln!(host, "  k{u}_{i}<<<1, 32{smem}>>>(d, 32);");
        }
    }
    if p.dead {
        let _ = writeln!(kernels, "__global__ void dead_{u}(int *out) {{ out[0] = {}; }}", 40 + u);
    }

    let mut s = top;
    s.push('\n');
    s.push_str(&defs);
    s.push('\n');
    s.push_str(&kernels);
    let _ = write!(s, "\nvoid host_{u}(int *d) {{\n{host}}}\n");
    if u == 0 {
        for v in 1..n {
            let _ = writeln!(s, "void host_{v}(int *d);");
        }
        s.push_str("int main() {\n  int *d;\n  cudaMalloc(&d, 1024);\n");
        for v in 0..n {
            let _ = writeln!(s, "  host_{v}(d);");
        }
        s.push_str("  cudaDeviceSynchronize();\n  return 0;\n}\n");
    }
    s
}

/// Compile `programs` with the real nvcc, every mode of every unit, on
/// `threads` threads, plus `lib/libgen<suffix>.a` (the units after the first)
/// per mode where there are two units or more. Returns each program's build
/// directory, keyed by its sources, modes and the toolkit, and reused while
/// those stay the same (a `done` file marks a complete build; a file lock
/// keeps concurrent test processes apart). Panics naming the seed and the unit
/// when nvcc fails: every generated program must compile.
pub fn compile(programs: &[Program], threads: usize) -> Vec<PathBuf> {
    let root = bin_dir().join("nvlinkd-gen");
    let lock = crate::corpus::lock_build_root(&root);
    let dirs: Vec<PathBuf> = programs.iter().map(|p| root.join(key(p))).collect();
    let mut jobs = Vec::new();
    for (p, dir) in programs.iter().zip(&dirs) {
        if dir.join("done").is_file() {
            continue;
        }
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir.join("lib")).expect("program dir");
        for u in &p.units {
            std::fs::write(dir.join(&u.name), &u.source).expect("write unit");
        }
        for &mode in &p.modes {
            for i in 0..p.units.len() {
                jobs.push((p, dir, mode, i));
            }
        }
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let failures = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| loop {
                let j = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(&(p, dir, mode, i)) = jobs.get(j) else { break };
                let obj = format!("u{i}{}.o", mode.suffix());
                let out = Command::new(cuda_home().join("bin/nvcc"))
                    .args(mode.nvcc_flags())
                    .arg("-dc")
                    .arg(&p.units[i].name)
                    .arg("-o")
                    .arg(&obj)
                    .current_dir(dir)
                    .output()
                    .expect("run nvcc");
                if !out.status.success() {
                    failures.lock().unwrap().push(format!(
                        "seed {}: nvcc {} -dc u{i}.cu failed in {}:\n{}",
                        p.seed,
                        mode.nvcc_flags().join(" "),
                        dir.display(),
                        String::from_utf8_lossy(&out.stderr)
                    ));
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap();
    assert!(failures.is_empty(), "generated programs that do not compile:\n{}", failures.join("\n"));
    for (p, dir) in programs.iter().zip(&dirs) {
        if dir.join("done").is_file() {
            continue;
        }
        if p.units.len() >= 2 {
            for &mode in &p.modes {
                let lib = format!("lib/libgen{}.a", mode.suffix());
                let st = Command::new("ar")
                    .arg("rcs")
                    .arg(&lib)
                    .args(&p.objects(mode)[1..])
                    .current_dir(dir)
                    .status()
                    .expect("run ar");
                assert!(st.success(), "ar rcs {lib} in {}", dir.display());
            }
        }
        std::fs::write(dir.join("done"), b"").expect("done marker");
    }
    drop(lock);
    dirs
}

/// The build directory name of `p`: its seed and a hash of what it compiles.
fn key(p: &Program) -> String {
    let mut h = blake3::Hasher::new();
    h.update(cuda_home().as_os_str().as_encoded_bytes());
    for u in &p.units {
        h.update(u.name.as_bytes());
        h.update(u.source.as_bytes());
    }
    for m in &p.modes {
        h.update(m.nvcc_flags().join(" ").as_bytes());
        h.update(b"\0");
    }
    format!("{}-{}", p.seed, &h.finalize().to_hex().as_str()[..12])
}

/// The generated sources of `p` written to `dir` (for a bug report).
pub fn write_sources(p: &Program, dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for u in &p.units {
        std::fs::write(dir.join(&u.name), &u.source)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_seed_one_program() {
        for seed in [0, 1, 2, 1000, u64::MAX] {
            let (a, b) = (program(seed), program(seed));
            assert_eq!(
                a.units.iter().map(|u| &u.source).collect::<Vec<_>>(),
                b.units.iter().map(|u| &u.source).collect::<Vec<_>>()
            );
            assert_eq!(
                a.links.iter().map(|l| &l.args).collect::<Vec<_>>(),
                b.links.iter().map(|l| &l.args).collect::<Vec<_>>()
            );
            assert!((1..=4).contains(&a.units.len()) && !a.links.is_empty());
        }
    }

    /// The programs of `NVLINKD_GEN_SEEDS` (a range `a..b` or a list), printed:
    /// `cargo test -p nvlinkd-tests --lib gen::tests::print -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn print() {
        let spec = std::env::var("NVLINKD_GEN_SEEDS").unwrap_or_else(|_| "1..13".into());
        let seeds: Vec<u64> = match spec.split_once("..") {
            Some((a, b)) => (a.parse().unwrap()..b.parse().unwrap()).collect(),
            None => spec.split(',').map(|s| s.trim().parse().unwrap()).collect(),
        };
        let sources = std::env::var_os("NVLINKD_GEN_PRINT_SOURCES").is_some();
        let mut total = 0;
        for seed in seeds {
            let p = program(seed);
            total += p.links.len();
            let names: Vec<&str> = p.links.iter().map(|l| l.name.as_str()).collect();
            println!("seed {seed}: {} units, modes {:?}, {} links {names:?}", p.units.len(), p.modes, p.links.len());
            if sources {
                for u in &p.units {
                    println!("--- {}\n{}", u.name, u.source);
                }
            }
        }
        println!("{total} links");
    }
}
