//! libnvJitLink, loaded once per toolkit and kept loaded.
//!
//! The library exports every entry point under versioned names
//! (`__nvJitLinkCreate_13_5`, ...); the header maps the plain names onto the
//! version the program was built against. We resolve the names of the toolkit's
//! own version (read from the toolkit, see [`crate::toolkit`]) so that the
//! library behaves as it does for nvcc and nvlink of the same release.
//!
//! A [`JitLink`] is `Send + Sync`: each link creates its own handle, and handles
//! are independent, so links run concurrently on the rayon pool.

use std::ffi::{c_char, c_int, c_void, CString};
use std::path::Path;

type Handle = *mut c_void;
type CreateFn = unsafe extern "C" fn(*mut Handle, u32, *const *const c_char) -> c_int;
type DestroyFn = unsafe extern "C" fn(*mut Handle) -> c_int;
type AddDataFn = unsafe extern "C" fn(Handle, c_int, *const c_void, usize, *const c_char) -> c_int;
type CompleteFn = unsafe extern "C" fn(Handle) -> c_int;
type SizeFn = unsafe extern "C" fn(Handle, *mut usize) -> c_int;
type GetFn = unsafe extern "C" fn(Handle, *mut c_char) -> c_int;

/// `nvJitLinkInputType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub enum InputType {
    Cubin = 1,
    Ptx = 2,
    LtoIr = 3,
    Fatbin = 4,
    Object = 5,
    Library = 6,
}

/// One input handed to nvJitLink.
pub struct JitInput<'a> {
    pub kind: InputType,
    pub data: &'a [u8],
    /// Name used by nvJitLink in its own messages.
    pub name: &'a str,
}

/// What a link produced.
#[derive(Debug, Default)]
pub struct JitOutput {
    pub cubin: Option<Vec<u8>>,
    /// PTX text (without the terminating NUL nvJitLink counts in its size).
    pub ptx: Option<Vec<u8>>,
    pub info_log: String,
}

#[derive(Debug, thiserror::Error)]
pub enum JitLinkError {
    #[error("cannot load {path}: {reason}")]
    Load { path: String, reason: String },
    /// `log`: nvJitLink's error log (for `complete`, its info log first).
    #[error("nvJitLink {call} failed with status {status}: {log}")]
    Call { call: &'static str, status: i32, log: String },
    #[error("invalid string argument for nvJitLink")]
    Nul,
}

/// The loaded library and its resolved entry points.
pub struct JitLink {
    create: CreateFn,
    destroy: DestroyFn,
    add_data: AddDataFn,
    complete: CompleteFn,
    cubin_size: SizeFn,
    cubin: GetFn,
    ptx_size: SizeFn,
    ptx: GetFn,
    error_log_size: SizeFn,
    error_log: GetFn,
    info_log_size: SizeFn,
    info_log: GetFn,
    // Keeps the code mapped for as long as the function pointers live.
    _lib: libloading::Library,
}

// Send and Sync hold on their own: the entry points are plain function
// pointers and `libloading::Library` is both. The C functions share no mutable
// state across handles, and every handle is used by one thread at a time.

impl JitLink {
    /// Load `path` and resolve the entry points of release `major.minor`.
    pub fn load(path: &Path, major: u32, minor: u32) -> Result<Self, JitLinkError> {
        let load_err = |reason: String| JitLinkError::Load { path: path.display().to_string(), reason };
        // SAFETY: loading a shared library runs its initializers; libnvJitLink's are benign.
        let lib = unsafe { libloading::Library::new(path) }.map_err(|e| load_err(e.to_string()))?;
        macro_rules! sym {
            ($name:literal, $ty:ty) => {{
                let name = format!("__nvJitLink{}_{}_{}\0", $name, major, minor);
                // SAFETY: the signature matches nvJitLink.h for this symbol.
                let f: libloading::Symbol<$ty> =
                    unsafe { lib.get(name.as_bytes()) }.map_err(|e| load_err(e.to_string()))?;
                *f
            }};
        }
        Ok(JitLink {
            create: sym!("Create", CreateFn),
            destroy: sym!("Destroy", DestroyFn),
            add_data: sym!("AddData", AddDataFn),
            complete: sym!("Complete", CompleteFn),
            cubin_size: sym!("GetLinkedCubinSize", SizeFn),
            cubin: sym!("GetLinkedCubin", GetFn),
            ptx_size: sym!("GetLinkedPtxSize", SizeFn),
            ptx: sym!("GetLinkedPtx", GetFn),
            error_log_size: sym!("GetErrorLogSize", SizeFn),
            error_log: sym!("GetErrorLog", GetFn),
            info_log_size: sym!("GetInfoLogSize", SizeFn),
            info_log: sym!("GetInfoLog", GetFn),
            _lib: lib,
        })
    }

    /// Link `inputs` with `options`; `want_ptx` fetches PTX (with `-lto -ptx`)
    /// instead of a cubin.
    pub fn link(&self, options: &[String], inputs: &[JitInput<'_>], want_ptx: bool) -> Result<JitOutput, JitLinkError> {
        let c_opts: Vec<CString> = options
            .iter()
            .map(|o| CString::new(o.as_str()))
            .collect::<Result<_, _>>()
            .map_err(|_| JitLinkError::Nul)?;
        let ptrs: Vec<*const c_char> = c_opts.iter().map(|c| c.as_ptr()).collect();
        // nvJitLink keeps the input names by pointer (its diagnostics read them at
        // complete time), so they live until the handle is destroyed: declared
        // before the guard, they are dropped after it.
        let mut names: Vec<CString> = Vec::with_capacity(inputs.len());
        let mut handle: Handle = std::ptr::null_mut();
        // SAFETY: pointers are valid for the call; handle is an out-parameter.
        let status = unsafe { (self.create)(&mut handle, ptrs.len() as u32, ptrs.as_ptr()) };
        if status != 0 || handle.is_null() {
            return Err(JitLinkError::Call { call: "create", status, log: String::new() });
        }
        let guard = HandleGuard { lib: self, handle };
        for input in inputs {
            names.push(CString::new(input.name).map_err(|_| JitLinkError::Nul)?);
            let name = names.last().map_or(std::ptr::null(), |n| n.as_ptr());
            // SAFETY: data and name outlive the handle (borrowed from the caller / held in `names`).
            let status = unsafe {
                (self.add_data)(guard.handle, input.kind as c_int, input.data.as_ptr().cast(), input.data.len(), name)
            };
            if status != 0 {
                return Err(JitLinkError::Call { call: "add", status, log: self.log(guard.handle, false) });
            }
        }
        // SAFETY: valid handle.
        let status = unsafe { (self.complete)(guard.handle) };
        let info_log = self.log(guard.handle, true);
        if status != 0 {
            // The info log first: nvlink prints the link's warnings (its
            // stack-size warnings) before its errors.
            let log = format!("{info_log}{}", self.log(guard.handle, false));
            return Err(JitLinkError::Call { call: "complete", status, log });
        }
        let mut out = JitOutput { info_log, ..Default::default() };
        if want_ptx {
            let mut ptx = self.fetch(guard.handle, self.ptx_size, self.ptx, "ptx")?;
            if ptx.last() == Some(&0) {
                ptx.pop();
            }
            out.ptx = Some(ptx);
        } else {
            out.cubin = Some(self.fetch(guard.handle, self.cubin_size, self.cubin, "cubin")?);
        }
        Ok(out)
    }

    fn fetch(&self, h: Handle, size: SizeFn, get: GetFn, what: &'static str) -> Result<Vec<u8>, JitLinkError> {
        let mut n = 0usize;
        // SAFETY: valid handle and out-pointer.
        let status = unsafe { size(h, &mut n) };
        if status != 0 {
            return Err(JitLinkError::Call { call: what, status, log: String::new() });
        }
        // nvJitLink writes a terminating NUL even for an empty log: never hand it
        // a zero-length buffer.
        let mut buf = vec![0u8; n.max(1)];
        // SAFETY: buf is at least the size nvJitLink asked for.
        let status = unsafe { get(h, buf.as_mut_ptr().cast()) };
        if status != 0 {
            return Err(JitLinkError::Call { call: what, status, log: String::new() });
        }
        buf.truncate(n);
        Ok(buf)
    }

    fn log(&self, h: Handle, info: bool) -> String {
        let (size, get) =
            if info { (self.info_log_size, self.info_log) } else { (self.error_log_size, self.error_log) };
        self.fetch(h, size, get, "log")
            .map(|mut b| {
                while b.last() == Some(&0) {
                    b.pop();
                }
                String::from_utf8_lossy(&b).into_owned()
            })
            .unwrap_or_default()
    }
}

struct HandleGuard<'a> {
    lib: &'a JitLink,
    handle: Handle,
}

impl Drop for HandleGuard<'_> {
    fn drop(&mut self) {
        // SAFETY: the handle came from create and is destroyed once.
        unsafe { (self.lib.destroy)(&mut self.handle) };
    }
}
