//! Modules, kernels and launches.
//!
//! A "PTX" image is any NUL-terminated text; its kernels are the names after `.entry`. Text
//! containing [`BAD_INSTRUCTION`] fails to compile with `CUDA_ERROR_INVALID_PTX` and a message
//! in the JIT error log, so a test can exercise a compile error. A CPU cannot run PTX, so
//! launches (`cuLaunchKernel` and kernel graph nodes) are checked and counted per function
//! name; kernels named [`ADD_KERNEL`] and [`SLOT_COPY_KERNEL`] also run, so tests can check
//! what arguments a launch really received (for example addresses substituted from a binding
//! table).
// Functions carry the driver's names so a reader can match them to cuda.h.
#![allow(non_snake_case)]

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};

use cuhal_sys::{
    CU_FUNC_ATTRIBUTE_BINARY_VERSION, CU_FUNC_ATTRIBUTE_CLUSTER_SIZE_MUST_BE_SET,
    CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES,
    CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
    CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, CU_FUNC_ATTRIBUTE_NUM_REGS,
    CU_FUNC_ATTRIBUTE_PTX_VERSION, CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH,
    CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT, CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH,
    CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, CU_JIT_ERROR_LOG_BUFFER,
    CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES, CU_JIT_INFO_LOG_BUFFER, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
    CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, CU_LAUNCH_ATTRIBUTE_COOPERATIVE,
    CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE, CU_LAUNCH_ATTRIBUTE_PRIORITY,
    CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, CUfunction, CUfunction_attribute,
    CUjit_option, CUlaunchAttributeID, CUlaunchAttributeValue, CUlaunchConfig, CUmodule, CUstream,
};

use crate::driver::{MAX_SHARED_OPTIN, MAX_THREADS_PER_BLOCK};
use crate::entry::{Status, ensure, entry, put};
use crate::status;
use crate::world::{World, handle, id, lookup, lookup_mut, world};

/// Text that makes a module fail to compile.
pub const BAD_INSTRUCTION: &str = "cuhal_not_an_instruction";
/// Dynamic shared memory a kernel may use before `cuFuncSetAttribute` raises it (48 KiB).
pub const DEFAULT_DYNAMIC_SHARED: c_int = 48 * 1024;
/// Registers every fake kernel reports.
pub const REGISTERS: c_int = 32;

/// The one kernel the fake runs: `cuhal_fake_add_u32(u32 *dst, const u32 *src, u32 k, u32 n)`
/// sets `dst[i] = src[i] + k` (wrapping) for `i < n`, whatever the grid: the signature of the
/// GPU suite's `add_u32`.
pub const ADD_KERNEL: &str = "cuhal_fake_add_u32";

/// The kernel graph slot copies run as: `cuhal_slot_copy(u8 *dst, const u8 *src, u64 n)`
/// copies `n` bytes, whatever the grid (the command crate's kernel of that name).
pub const SLOT_COPY_KERNEL: &str = "cuhal_slot_copy";

/// A kernel that stamps itself (`cuhal_zone_stamp.cuh`): `cuhal_fake_stamp(cuhal_zone_stamp*
/// zone, u64 begin, u64 end)` folds, when `zone` is not null, `~begin` into its first word and
/// `end` into its second with a max, as the header's reductions do (so a slot not zeroed before
/// reuse shows), `begin` and `end` standing for its blocks' `%globaltimer` readings.
pub const STAMP_KERNEL: &str = "cuhal_fake_stamp";

/// The arguments of one launch of a kernel the fake runs ([`ADD_KERNEL`] or
/// [`SLOT_COPY_KERNEL`]), read when it is enqueued (or its node made or updated), as the driver
/// copies argument values then.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum KernelCall {
    Add {
        input: u64,
        output: u64,
        n: u32,
        addend: u32,
    },
    Copy {
        target: u64,
        source: u64,
        len: u64,
    },
    Stamp {
        zone: u64,
        begin: u64,
        end: u64,
    },
}

impl KernelCall {
    /// Reads the arguments of a launch of `name`: `Some` for a kernel the fake runs.
    ///
    /// # Safety
    /// For a kernel the fake runs, `params` is null (refused) or holds one pointer per
    /// parameter to a value of its type, as cuda.h requires of a launch.
    pub(crate) unsafe fn read(name: &str, params: *mut *mut c_void) -> Result<Option<Self>, c_int> {
        let count = match name {
            ADD_KERNEL => 4,
            SLOT_COPY_KERNEL | STAMP_KERNEL => 3,
            _ => return Ok(None),
        };
        ensure(!params.is_null(), status::INVALID_VALUE)?;
        // SAFETY: `count` pointers to values of the parameter types (the caller's contract).
        unsafe {
            let p = std::slice::from_raw_parts(params, count);
            ensure(p.iter().all(|p| !p.is_null()), status::INVALID_VALUE)?;
            let u64_at = |i: usize| p[i].cast::<u64>().read_unaligned();
            if name == STAMP_KERNEL {
                return Ok(Some(Self::Stamp {
                    zone: u64_at(0),
                    begin: u64_at(1),
                    end: u64_at(2),
                }));
            }
            Ok(Some(if name == ADD_KERNEL {
                Self::Add {
                    output: u64_at(0),
                    input: u64_at(1),
                    addend: p[2].cast::<u32>().read_unaligned(),
                    n: p[3].cast::<u32>().read_unaligned(),
                }
            } else {
                Self::Copy {
                    target: u64_at(0),
                    source: u64_at(1),
                    len: u64_at(2),
                }
            }))
        }
    }
}

impl KernelCall {
    /// The arguments in the kernel's parameter layout (24 bytes for both kernels).
    fn to_bytes(self) -> [u8; 24] {
        let mut bytes = [0u8; 24];
        match self {
            Self::Add {
                input,
                output,
                n,
                addend,
            } => {
                bytes[0..8].copy_from_slice(&output.to_ne_bytes());
                bytes[8..16].copy_from_slice(&input.to_ne_bytes());
                bytes[16..20].copy_from_slice(&addend.to_ne_bytes());
                bytes[20..24].copy_from_slice(&n.to_ne_bytes());
            }
            Self::Copy {
                target: a,
                source: b,
                len: c,
            }
            | Self::Stamp {
                zone: a,
                begin: b,
                end: c,
            } => {
                bytes[0..8].copy_from_slice(&a.to_ne_bytes());
                bytes[8..16].copy_from_slice(&b.to_ne_bytes());
                bytes[16..24].copy_from_slice(&c.to_ne_bytes());
            }
        }
        bytes
    }

    /// Writes the 8 bytes of `value` at byte `offset` of the parameters, as a device-side
    /// `cudaGraphKernelNodeSetParam` does; an offset past the parameters is refused.
    pub(crate) fn patch(&mut self, offset: usize, value: u64) -> Status {
        let mut bytes = self.to_bytes();
        let end = offset.checked_add(8).ok_or(status::INVALID_VALUE)?;
        ensure(end <= bytes.len(), status::INVALID_VALUE)?;
        bytes[offset..end].copy_from_slice(&value.to_ne_bytes());
        let u64_at =
            |at: usize| u64::from_ne_bytes(bytes[at..at + 8].try_into().unwrap_or_default());
        let u32_at =
            |at: usize| u32::from_ne_bytes(bytes[at..at + 4].try_into().unwrap_or_default());
        *self = match *self {
            Self::Add { .. } => Self::Add {
                output: u64_at(0),
                input: u64_at(8),
                addend: u32_at(16),
                n: u32_at(20),
            },
            Self::Copy { .. } => Self::Copy {
                target: u64_at(0),
                source: u64_at(8),
                len: u64_at(16),
            },
            Self::Stamp { .. } => Self::Stamp {
                zone: u64_at(0),
                begin: u64_at(8),
                end: u64_at(16),
            },
        };
        Ok(())
    }
}

impl World {
    /// Runs a launch of a kernel the fake runs: every range must lie in one live device
    /// allocation (a bad address is `CUDA_ERROR_ILLEGAL_ADDRESS`, as a faulting kernel would
    /// report).
    pub(crate) fn run_call(&self, call: KernelCall) -> Status {
        match call {
            KernelCall::Add {
                input,
                output,
                n,
                addend,
            } => {
                let bytes = n as usize * 4;
                if bytes == 0 {
                    return Ok(());
                }
                let input = self
                    .device_span(input, bytes)
                    .map_err(|_| status::ILLEGAL_ADDRESS)?;
                let output = self
                    .device_span(output, bytes)
                    .map_err(|_| status::ILLEGAL_ADDRESS)?;
                for i in 0..n as usize {
                    // SAFETY: both spans hold `n` u32 values of live allocations (the world's
                    // lock keeps them alive); unaligned accesses, element by element, tolerate
                    // any overlap.
                    unsafe {
                        let value = input.add(i * 4).cast::<u32>().read_unaligned();
                        output
                            .add(i * 4)
                            .cast::<u32>()
                            .write_unaligned(value.wrapping_add(addend));
                    }
                }
            }
            KernelCall::Copy {
                target,
                source,
                len,
            } => {
                let len = usize::try_from(len).map_err(|_| status::ILLEGAL_ADDRESS)?;
                if len == 0 {
                    return Ok(());
                }
                let source = self
                    .device_span(source, len)
                    .map_err(|_| status::ILLEGAL_ADDRESS)?;
                let target = self
                    .device_span(target, len)
                    .map_err(|_| status::ILLEGAL_ADDRESS)?;
                // SAFETY: both spans hold `len` bytes of live allocations (the world's lock
                // keeps them alive); `copy` tolerates overlap.
                unsafe { std::ptr::copy(source, target, len) };
            }
            KernelCall::Stamp { zone, begin, end } => {
                if zone == 0 {
                    return Ok(());
                }
                let slot = self
                    .device_span(zone, 16)
                    .map_err(|_| status::ILLEGAL_ADDRESS)?;
                for (word, value) in [(0, !begin), (1, end)] {
                    // SAFETY: the span holds 16 bytes of a live allocation (the world's lock
                    // keeps it alive); unaligned accesses tolerate any address.
                    unsafe {
                        let at = slot.add(word * 8).cast::<u64>();
                        at.write_unaligned(at.read_unaligned().max(value));
                    }
                }
            }
        }
        Ok(())
    }
}

/// A loaded module.
#[derive(Debug)]
pub(crate) struct Module {
    functions: Vec<usize>,
}

/// A kernel of a module.
#[derive(Debug)]
pub(crate) struct Function {
    module: usize,
    pub name: String,
    max_dynamic_shared: c_int,
    /// The cluster shape from `.reqnctapercluster` in the kernel's header; zeros when none.
    pub required_cluster: [c_uint; 3],
    /// `(offset, size)` of each `.param` in the kernel's header, for `cuFuncGetParamInfo`.
    pub parameters: Vec<(usize, usize)>,
}

/// The `(offset, size)` of each parameter the kernel `name` declares: `.param .TYPE name` or
/// `.param [.align A] .TYPE name[N]`, laid out in order, each aligned to its alignment (its
/// element size unless `.align` says otherwise), as the driver reports them.
fn parameters(text: &str, name: &str) -> Vec<(usize, usize)> {
    let Some(start) = text.find(&format!(".entry {name}")) else {
        return Vec::new();
    };
    let header = &text[start..];
    let header = &header[..header.find('{').unwrap_or(header.len())];
    let (Some(open), Some(close)) = (header.find('('), header.rfind(')')) else {
        return Vec::new();
    };
    let mut offset = 0usize;
    let mut out = Vec::new();
    for param in header[open + 1..close].split(',') {
        let words: Vec<&str> = param.split_whitespace().collect();
        if !words.contains(&".param") {
            continue;
        }
        let element = words
            .iter()
            .find_map(|w| match w.get(2..) {
                Some("8") if w.starts_with(".u") || w.starts_with(".s") || w.starts_with(".b") => {
                    Some(1)
                }
                Some("16") => Some(2),
                Some("32") => Some(4),
                Some("64") => Some(8),
                _ => None,
            })
            .unwrap_or(8usize);
        let align: usize = words
            .iter()
            .position(|w| *w == ".align")
            .and_then(|i| words.get(i + 1)?.parse().ok())
            .unwrap_or(element);
        let count: usize = words
            .last()
            .and_then(|w| w.split_once('['))
            .and_then(|(_, n)| n.trim_end_matches(']').parse().ok())
            .unwrap_or(1);
        offset = offset.next_multiple_of(align.max(1));
        out.push((offset, element * count));
        offset += element * count;
    }
    out
}

/// The cluster shape a kernel's header declares with `.reqnctapercluster x, y, z` (missing
/// axes are 1), or zeros. The header is the text from the name to the body's `{`.
fn required_cluster(text: &str, name: &str) -> [c_uint; 3] {
    let Some(start) = text.find(&format!(".entry {name}")) else {
        return [0; 3];
    };
    let header = &text[start..];
    let header = &header[..header.find('{').unwrap_or(header.len())];
    let Some(at) = header.find(".reqnctapercluster") else {
        return [0; 3];
    };
    let mut dims = [1; 3];
    let values = header[at + ".reqnctapercluster".len()..]
        .split(',')
        .map(|v| v.split_whitespace().next().unwrap_or("").parse::<c_uint>());
    for (slot, value) in dims.iter_mut().zip(values) {
        match value {
            Ok(v) => *slot = v,
            Err(_) => break,
        }
    }
    dims
}

/// Blocks of `threads` threads using `shared` bytes of dynamic shared memory that one
/// multiprocessor holds at once: 2048 threads, 32 blocks, 228 KiB of shared memory (1 KiB of
/// it reserved per block), as on Hopper.
pub fn blocks_per_multiprocessor(threads: u64, shared: u64) -> u64 {
    if threads == 0 {
        return 0;
    }
    let by_threads = 2048 / threads;
    let by_shared = (228 * 1024) / (shared + 1024);
    by_threads.min(by_shared).min(32)
}

/// The kernels of `text`: every name after `.entry`.
fn entries(text: &str) -> Vec<&str> {
    text.split(".entry")
        .skip(1)
        .filter_map(|rest| {
            let rest = rest.trim_start();
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '$'))
                .unwrap_or(rest.len());
            (end > 0).then(|| &rest[..end])
        })
        .collect()
}

impl World {
    /// Checks a launch of `function` against CUDA's and the function's limits.
    pub(crate) fn check_launch(
        &self,
        function: usize,
        grid: [c_uint; 3],
        block: [c_uint; 3],
        shared: c_uint,
    ) -> Status {
        let function = lookup(&self.functions, function)?;
        let threads: u64 = block.iter().map(|&b| u64::from(b)).product();
        ensure(
            grid.iter().chain(&block).all(|&d| d >= 1)
                && grid[1] <= 65_535
                && grid[2] <= 65_535
                && block[2] <= 64
                && threads <= MAX_THREADS_PER_BLOCK as u64,
            status::INVALID_VALUE,
        )?;
        ensure(
            i64::from(shared) <= i64::from(function.max_dynamic_shared),
            status::INVALID_VALUE,
        )
    }
}

impl World {
    /// Checks one launch attribute for a launch of `function` with this shape: a cluster must
    /// tile the grid, have at most 8 blocks and match a compiled-in one; a cooperative grid must
    /// fit on the device at once; a priority must be in the context's range. Device-updatable
    /// nodes are only for graphs (`graph`).
    #[allow(clippy::too_many_arguments)] // the launch's shape, as cuda.h passes it
    pub(crate) fn check_attribute(
        &self,
        function: usize,
        grid: [c_uint; 3],
        block: [c_uint; 3],
        shared: c_uint,
        attribute: CUlaunchAttributeID,
        value: &CUlaunchAttributeValue,
        graph: bool,
    ) -> Status {
        let function = lookup(&self.functions, function)?;
        match attribute {
            CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION => {
                let cluster = value.as_dims();
                let blocks: u64 = cluster.iter().map(|&c| u64::from(c)).product();
                ensure(
                    cluster.iter().all(|&c| c >= 1)
                        && grid.iter().zip(cluster).all(|(&g, c)| g % c == 0)
                        && blocks <= 8
                        && (function.required_cluster == [0; 3]
                            || function.required_cluster == cluster),
                    status::INVALID_VALUE,
                )
            }
            CU_LAUNCH_ATTRIBUTE_COOPERATIVE => {
                let threads: u64 = block.iter().map(|&b| u64::from(b)).product();
                let blocks: u64 = grid.iter().map(|&g| u64::from(g)).product();
                let max = blocks_per_multiprocessor(threads, u64::from(shared))
                    * crate::driver::MULTIPROCESSORS as u64;
                ensure(value.as_int() == 0 || blocks <= max, COOPERATIVE_TOO_LARGE)
            }
            CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION => ensure(
                !graph && (0..=1).contains(&value.as_int()),
                status::INVALID_VALUE,
            ),
            CU_LAUNCH_ATTRIBUTE_PRIORITY => ensure(
                (crate::stream::GREATEST_PRIORITY..=crate::stream::LEAST_PRIORITY)
                    .contains(&value.as_int()),
                status::INVALID_VALUE,
            ),
            CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE => {
                ensure(graph && value.as_int() == 1, status::INVALID_VALUE)
            }
            _ => Err(status::INVALID_VALUE),
        }
    }
}

/// `CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE`.
pub const COOPERATIVE_TOO_LARGE: c_int = 720;

/// Writes `text` into a JIT log buffer given by the options, and its length into the size slot.
///
/// # Safety
/// `values` holds one writable pointer-sized slot per option; a log buffer option's value is
/// writable for the size its size option gives.
unsafe fn write_log(
    options: &[CUjit_option],
    values: *mut *mut c_void,
    buffer_option: CUjit_option,
    size_option: CUjit_option,
    text: &str,
) {
    let slot = |option| options.iter().position(|&o| o == option);
    let (Some(buffer_slot), Some(size_slot)) = (slot(buffer_option), slot(size_option)) else {
        return;
    };
    // SAFETY: both slots are inside `values` (caller's contract).
    let (buffer, size) = unsafe { (*values.add(buffer_slot), (*values.add(size_slot)).addr()) };
    if buffer.is_null() || size == 0 {
        return;
    }
    let n = text.len().min(size - 1);
    // SAFETY: the buffer is writable for `size` > n bytes (caller's contract); the size slot is
    // writable, and like the real driver the fake reports the bytes written there.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr(), buffer.cast::<u8>(), n);
        buffer.cast::<u8>().add(n).write(0);
        values
            .add(size_slot)
            .write(std::ptr::without_provenance_mut(n + 1));
    }
}

/// Loads `image` with the given JIT options.
///
/// # Safety
/// `image` is null or NUL-terminated; `options` and `values` hold `count` entries each (or are
/// null with `count` 0), as cuda.h describes them.
unsafe fn load(
    out: *mut CUmodule,
    image: *const c_void,
    count: c_uint,
    options: *mut CUjit_option,
    values: *mut *mut c_void,
) -> Status {
    ensure(!out.is_null() && !image.is_null(), status::INVALID_VALUE)?;
    ensure(
        count == 0 || (!options.is_null() && !values.is_null()),
        status::INVALID_VALUE,
    )?;
    let options = if count == 0 {
        &[][..]
    } else {
        // SAFETY: non-null and holding `count` options by the caller's contract.
        unsafe { std::slice::from_raw_parts(options, count as usize) }
    };
    // SAFETY: non-null and NUL-terminated by the caller's contract.
    let text = unsafe { CStr::from_ptr(image.cast::<c_char>()) }.to_string_lossy();
    ensure(!text.trim().is_empty(), status::INVALID_IMAGE)?;
    let mut world = world();
    world.current_context()?;
    if let Some(at) = text.find(BAD_INSTRUCTION) {
        let line = text[..at].lines().count().max(1);
        let log = format!("ptxas fatal   : line {line}: unknown instruction '{BAD_INSTRUCTION}'");
        // SAFETY: forwarded caller contract.
        unsafe {
            write_log(
                options,
                values,
                CU_JIT_ERROR_LOG_BUFFER,
                CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
                &log,
            )
        };
        return Err(status::INVALID_PTX);
    }
    let names = entries(&text);
    let module = world.new_handle();
    let mut functions = Vec::with_capacity(names.len());
    for name in &names {
        let function = world.new_handle();
        world.functions.insert(
            function,
            Function {
                module,
                name: (*name).to_owned(),
                max_dynamic_shared: DEFAULT_DYNAMIC_SHARED,
                required_cluster: required_cluster(&text, name),
                parameters: parameters(&text, name),
            },
        );
        functions.push(function);
    }
    world.modules.insert(module, Module { functions });
    let log = format!(
        "ptxas info    : cuhal fake JIT compiled {} entries: {}",
        names.len(),
        names.join(", ")
    );
    // SAFETY: forwarded caller contract.
    unsafe {
        write_log(
            options,
            values,
            CU_JIT_INFO_LOG_BUFFER,
            CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
            &log,
        );
        put(out, handle(module))
    }
}

/// `CUresult cuModuleLoadData(CUmodule *module, const void *image)`.
///
/// # Safety
/// `out` is null or writable; `image` is null or NUL-terminated text.
pub unsafe extern "C" fn cuModuleLoadData(out: *mut CUmodule, image: *const c_void) -> c_int {
    // SAFETY: forwarded caller contract; no options.
    entry("cuModuleLoadData", || unsafe {
        load(out, image, 0, std::ptr::null_mut(), std::ptr::null_mut())
    })
}

/// `CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int numOptions,
/// CUjit_option *options, void **optionValues)`: honours the info and error log options.
///
/// # Safety
/// As cuda.h: `options` and `values` hold `count` entries, log buffers their given sizes.
pub unsafe extern "C" fn cuModuleLoadDataEx(
    out: *mut CUmodule,
    image: *const c_void,
    count: c_uint,
    options: *mut CUjit_option,
    values: *mut *mut c_void,
) -> c_int {
    // SAFETY: forwarded caller contract.
    entry("cuModuleLoadDataEx", || unsafe {
        load(out, image, count, options, values)
    })
}

/// `CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)`.
///
/// # Safety
/// `out` is null or writable; `name` is null or NUL-terminated.
pub unsafe extern "C" fn cuModuleGetFunction(
    out: *mut CUfunction,
    module: CUmodule,
    name: *const c_char,
) -> c_int {
    entry("cuModuleGetFunction", || {
        ensure(!out.is_null() && !name.is_null(), status::INVALID_VALUE)?;
        // SAFETY: non-null and NUL-terminated by the caller's contract.
        let name = unsafe { CStr::from_ptr(name) }.to_string_lossy();
        let world = world();
        let module = lookup(&world.modules, id(module)?)?;
        let function = module
            .functions
            .iter()
            .find(|f| world.functions.get(f).is_some_and(|f| f.name == name))
            .ok_or(status::NOT_FOUND)?;
        // SAFETY: forwarded caller contract (checked non-null above).
        unsafe { put(out, handle(*function)) }
    })
}

/// `CUresult cuModuleUnload(CUmodule hmod)`.
pub extern "C" fn cuModuleUnload(module: CUmodule) -> c_int {
    entry("cuModuleUnload", || {
        let mut world = world();
        let module = id(module)?;
        let module = world
            .modules
            .remove(&module)
            .ok_or(status::INVALID_HANDLE)?;
        for function in module.functions {
            world.functions.remove(&function);
        }
        Ok(())
    })
}

/// `CUresult cuFuncGetParamInfo(CUfunction func, size_t paramIndex, size_t *paramOffset, size_t
/// *paramSize)`: the layout of the `.param` list of the kernel's header;
/// `CUDA_ERROR_INVALID_VALUE` past the last one.
///
/// # Safety
/// Each out-pointer is null or valid for one write.
pub unsafe extern "C" fn cuFuncGetParamInfo(
    function: CUfunction,
    index: usize,
    offset: *mut usize,
    size: *mut usize,
) -> c_int {
    entry("cuFuncGetParamInfo", || {
        ensure(!offset.is_null() && !size.is_null(), status::INVALID_VALUE)?;
        let world = world();
        let function = lookup(&world.functions, id(function)?)?;
        let &(at, bytes) = function
            .parameters
            .get(index)
            .ok_or(status::INVALID_VALUE)?;
        // SAFETY: forwarded caller contract (checked non-null above).
        unsafe {
            put(offset, at)?;
            put(size, bytes)
        }
    })
}

/// `CUresult cuFuncGetParamCount(CUfunction func, size_t *paramCount)`.
///
/// # Safety
/// `count` is null or valid for one write.
pub unsafe extern "C" fn cuFuncGetParamCount(function: CUfunction, count: *mut usize) -> c_int {
    entry("cuFuncGetParamCount", || {
        ensure(!count.is_null(), status::INVALID_VALUE)?;
        let world = world();
        let function = lookup(&world.functions, id(function)?)?;
        // SAFETY: forwarded caller contract (checked non-null above).
        unsafe { put(count, function.parameters.len()) }
    })
}

/// `CUresult cuFuncGetAttribute(int *pi, CUfunction_attrib attrib, CUfunction hfunc)`: every
/// kernel uses 32 registers, no static shared, constant or local memory, PTX ISA 8.0 and
/// sm_90.
///
/// # Safety
/// `out` is null or valid for one write.
pub unsafe extern "C" fn cuFuncGetAttribute(
    out: *mut c_int,
    attribute: CUfunction_attribute,
    function: CUfunction,
) -> c_int {
    entry("cuFuncGetAttribute", || {
        let world = world();
        let function = lookup(&world.functions, id(function)?)?;
        lookup(&world.modules, function.module)?;
        let value = match attribute {
            CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK => MAX_THREADS_PER_BLOCK,
            CU_FUNC_ATTRIBUTE_NUM_REGS => REGISTERS,
            CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES
            | CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES
            | CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES => 0,
            CU_FUNC_ATTRIBUTE_PTX_VERSION => 80,
            CU_FUNC_ATTRIBUTE_BINARY_VERSION => 90,
            CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES => function.max_dynamic_shared,
            CU_FUNC_ATTRIBUTE_CLUSTER_SIZE_MUST_BE_SET
            | CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED => 0,
            CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH => function.required_cluster[0] as c_int,
            CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT => function.required_cluster[1] as c_int,
            CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH => function.required_cluster[2] as c_int,
            _ => return Err(status::INVALID_VALUE),
        };
        // SAFETY: forwarded caller contract.
        unsafe { put(out, value) }
    })
}

/// `CUresult cuFuncSetAttribute(CUfunction hfunc, CUfunction_attribute attrib, int value)`: only
/// the maximum dynamic shared memory, up to the device's opt-in limit.
pub extern "C" fn cuFuncSetAttribute(
    function: CUfunction,
    attribute: CUfunction_attribute,
    value: c_int,
) -> c_int {
    entry("cuFuncSetAttribute", || {
        let mut world = world();
        let function = lookup_mut(&mut world.functions, id(function)?)?;
        ensure(
            attribute == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
                && (0..=MAX_SHARED_OPTIN).contains(&value),
            status::INVALID_VALUE,
        )?;
        function.max_dynamic_shared = value;
        Ok(())
    })
}

/// `CUresult cuLaunchKernel(CUfunction f, unsigned gridDimX, .., unsigned blockDimZ, unsigned
/// sharedMemBytes, CUstream hStream, void **kernelParams, void **extra)`: checked and counted
/// (and run, for [`ADD_KERNEL`]).
///
/// # Safety
/// `params` as cuda.h requires: for [`ADD_KERNEL`], null or four pointers to its arguments.
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cuLaunchKernel(
    function: CUfunction,
    grid_x: c_uint,
    grid_y: c_uint,
    grid_z: c_uint,
    block_x: c_uint,
    block_y: c_uint,
    block_z: c_uint,
    shared: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
    _extra: *mut *mut c_void,
) -> c_int {
    entry("cuLaunchKernel", || {
        let mut world = world();
        world.stream_device(stream)?;
        let function = id(function)?;
        world.check_launch(
            function,
            [grid_x, grid_y, grid_z],
            [block_x, block_y, block_z],
            shared,
        )?;
        let name = world.functions[&function].name.clone();
        // SAFETY: cuda.h's contract for `kernelParams`.
        let call = unsafe { KernelCall::read(&name, params) }?;
        let (grid, block) = ([grid_x, grid_y, grid_z], [block_x, block_y, block_z]);
        if world.captured(stream, || {
            crate::graph::Op::kernel(function, grid, block, shared).with_call(call)
        })? {
            return Ok(());
        }
        if let Some(call) = call {
            world.run_call(call)?;
        }
        *world.launches.entry(name).or_insert(0) += 1;
        world.occupy(stream);
        Ok(())
    })
}

/// `CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
/// void **extra)`: checked like `cuLaunchKernel`, each attribute checked, and counted.
///
/// # Safety
/// `config` is null or readable, with `numAttrs` readable attributes.
pub unsafe extern "C" fn cuLaunchKernelEx(
    config: *const CUlaunchConfig,
    function: CUfunction,
    _params: *mut *mut c_void,
    _extra: *mut *mut c_void,
) -> c_int {
    entry("cuLaunchKernelEx", || {
        ensure(!config.is_null(), status::INVALID_VALUE)?;
        // SAFETY: non-null and readable by the caller's contract.
        let config = unsafe { config.read() };
        ensure(
            config.numAttrs == 0 || !config.attrs.is_null(),
            status::INVALID_VALUE,
        )?;
        let attributes = if config.numAttrs == 0 {
            &[][..]
        } else {
            // SAFETY: non-null and holding `numAttrs` attributes by the caller's contract.
            unsafe { std::slice::from_raw_parts(config.attrs, config.numAttrs as usize) }
        };
        let mut world = world();
        world.stream_device(config.hStream)?;
        let function = id(function)?;
        let grid = [config.gridDimX, config.gridDimY, config.gridDimZ];
        let block = [config.blockDimX, config.blockDimY, config.blockDimZ];
        world.check_launch(function, grid, block, config.sharedMemBytes)?;
        for attribute in attributes {
            world.check_attribute(
                function,
                grid,
                block,
                config.sharedMemBytes,
                attribute.id,
                &attribute.value,
                false,
            )?;
        }
        let shared = config.sharedMemBytes;
        if world.captured(config.hStream, || {
            crate::graph::Op::kernel(function, grid, block, shared)
        })? {
            return Ok(());
        }
        let name = world.functions[&function].name.clone();
        *world.launches.entry(name).or_insert(0) += 1;
        Ok(())
    })
}

/// `CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *numBlocks, CUfunction func, int
/// blockSize, size_t dynamicSMemSize)`: see [`blocks_per_multiprocessor`].
///
/// # Safety
/// `out` is null or valid for one write.
pub unsafe extern "C" fn cuOccupancyMaxActiveBlocksPerMultiprocessor(
    out: *mut c_int,
    function: CUfunction,
    block_size: c_int,
    shared: usize,
) -> c_int {
    entry("cuOccupancyMaxActiveBlocksPerMultiprocessor", || {
        let world = world();
        lookup(&world.functions, id(function)?)?;
        ensure(block_size >= 1, status::INVALID_VALUE)?;
        let blocks = blocks_per_multiprocessor(block_size as u64, shared as u64);
        // SAFETY: forwarded caller contract.
        unsafe { put(out, blocks as c_int) }
    })
}

/// `CUresult cuOccupancyMaxActiveClusters(int *numClusters, CUfunction func, const
/// CUlaunchConfig *config)`: clusters of at most 8 blocks whose shared memory fits one
/// multiprocessor's share; 0 otherwise.
///
/// # Safety
/// `out` is null or valid for one write; `config` as for [`cuLaunchKernelEx`].
pub unsafe extern "C" fn cuOccupancyMaxActiveClusters(
    out: *mut c_int,
    function: CUfunction,
    config: *const CUlaunchConfig,
) -> c_int {
    entry("cuOccupancyMaxActiveClusters", || {
        ensure(!config.is_null(), status::INVALID_VALUE)?;
        // SAFETY: non-null and readable by the caller's contract.
        let config = unsafe { config.read() };
        let world = world();
        let function = lookup(&world.functions, id(function)?)?;
        let attributes = if config.numAttrs == 0 || config.attrs.is_null() {
            &[][..]
        } else {
            // SAFETY: non-null and holding `numAttrs` attributes by the caller's contract.
            unsafe { std::slice::from_raw_parts(config.attrs, config.numAttrs as usize) }
        };
        let cluster = attributes
            .iter()
            .find(|a| a.id == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION)
            .map(|a| a.value.as_dims())
            .unwrap_or(function.required_cluster);
        let blocks: u64 = cluster.iter().map(|&c| u64::from(c.max(1))).product();
        let threads = u64::from(config.blockDimX * config.blockDimY * config.blockDimZ);
        let per_sm = blocks_per_multiprocessor(threads, u64::from(config.sharedMemBytes));
        let clusters = if blocks > 8 || per_sm == 0 {
            0
        } else {
            (per_sm * crate::driver::MULTIPROCESSORS as u64) / blocks
        };
        // SAFETY: forwarded caller contract.
        unsafe { put(out, clusters as c_int) }
    })
}

#[cfg(test)]
mod tests {
    use super::{entries, required_cluster};

    #[test]
    fn the_cluster_comes_from_the_kernels_own_header() {
        let ptx = ".entry a(.param .u64 p) .reqnctapercluster 2, 1, 1 { ret; }\n.entry b() { .reqnctapercluster 4; }";
        assert_eq!(required_cluster(ptx, "a"), [2, 1, 1]);
        assert_eq!(
            required_cluster(ptx, "b"),
            [0; 3],
            "inside the body, not the header"
        );
        assert_eq!(
            required_cluster(".entry c() .reqnctapercluster 4 {}", "c"),
            [4, 1, 1]
        );
    }

    #[test]
    fn entries_are_the_names_after_dot_entry() {
        let ptx = ".version 8.0\n.visible .entry fill_u32(\n.param .u64 p)\n{ ret; }\n.entry  spin$1 () {}\n.func helper() {}";
        assert_eq!(entries(ptx), ["fill_u32", "spin$1"]);
        assert!(entries(".func f() {}").is_empty());
        assert!(entries(".entry (").is_empty());
    }
}
