//! The [`Gpu`] fixture and the small RAII wrappers the suite's tests share.
//!
//! These are deliberately thin layers over `cuhal-sys`, so a failing test points at the
//! driver call that failed rather than at a higher cuhal crate. They panic on misuse (a
//! buffer too small for a copy), as test helpers may; driver failures are returned.

use std::ffi::c_void;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use cuhal_sys::{CUdeviceptr, CUfunction, CUresult, DriverApi, Error, PrimaryContext, cu};

/// Chooses the device the suite runs on (an ordinal; default 0).
pub const DEVICE_ENV: &str = "CUHAL_TEST_DEVICE";
/// Fixes the random seed, to repeat a run (see [`seed`]).
pub const SEED_ENV: &str = "CUHAL_TEST_SEED";

/// The driver and device `CUHAL_TEST_DEVICE` (default 0), with its primary context retained
/// and current on the creating thread. The context is released when the fixture and every
/// buffer and module made from it are gone.
pub struct Gpu {
    context: Arc<PrimaryContext>,
}

impl Gpu {
    /// Loads the driver and retains the device's primary context; panics with the reason if
    /// that fails, which is what a GPU test should do on a machine without a usable GPU.
    pub fn open() -> Gpu {
        Gpu::try_open().unwrap_or_else(|e| panic!("no usable CUDA device: {e}"))
    }

    /// As [`Gpu::open`], returning the error.
    pub fn try_open() -> Result<Gpu, Error> {
        let api = Arc::new(DriverApi::load()?);
        let context = PrimaryContext::retain(api, device_ordinal())?;
        Ok(Gpu { context })
    }

    /// The driver table.
    pub fn api(&self) -> &DriverApi {
        self.context.api()
    }

    /// The retained primary context.
    pub fn context(&self) -> &Arc<PrimaryContext> {
        &self.context
    }

    /// Allocates `bytes` of device memory (`cuMemAlloc`).
    pub fn alloc(&self, bytes: usize) -> Result<DeviceBuffer, Error> {
        self.context.bind()?;
        let mut ptr: CUdeviceptr = 0;
        // SAFETY: `ptr` is a valid out-pointer and the context is current.
        unsafe { cu!(self.api(), cuMemAlloc(&mut ptr, bytes)) }?;
        Ok(DeviceBuffer {
            context: self.context.clone(),
            ptr,
            bytes,
        })
    }

    /// Loads a PTX module (`cuModuleLoadDataEx`), returning the JIT's error log with any
    /// failure.
    pub fn load_ptx(&self, ptx: &str) -> Result<Module, ModuleError> {
        match cuhal_sys::Module::load_ptx(&self.context, ptx) {
            Ok(module) => Ok(Module(module)),
            Err(Error::ModuleLoad { source, log }) => Err(ModuleError {
                error: *source,
                log,
            }),
            Err(error) => Err(ModuleError {
                error,
                log: String::new(),
            }),
        }
    }

    /// Launches `function` over a 1-D grid covering `elements` threads in blocks of `block`,
    /// on the legacy default stream, and waits for it (`cuCtxSynchronize`).
    ///
    /// # Safety
    /// `params` holds one pointer per kernel parameter, each to a value of that parameter's
    /// type, as `cuLaunchKernel` requires; device pointers among them must be valid for
    /// everything the kernel touches.
    pub unsafe fn launch_1d(
        &self,
        function: &Function<'_>,
        elements: u32,
        block: u32,
        params: &mut [*mut c_void],
    ) -> Result<(), Error> {
        assert!(block > 0);
        self.context.bind()?;
        let grid = elements.div_ceil(block).max(1);
        // SAFETY: `function` belongs to a live module of this context; the parameter
        // contract is the caller's; a null stream and null `extra` are allowed.
        unsafe {
            cu!(
                self.api(),
                cuLaunchKernel(
                    function.raw,
                    grid,
                    1,
                    1,
                    block,
                    1,
                    1,
                    0,
                    std::ptr::null_mut(),
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            )
        }?;
        self.synchronize()
    }

    /// Waits for all work in the context (`cuCtxSynchronize`).
    pub fn synchronize(&self) -> Result<(), Error> {
        self.context.bind()?;
        // SAFETY: the context is current.
        unsafe { cu!(self.api(), cuCtxSynchronize()) }
    }
}

/// `CUHAL_TEST_DEVICE`, or 0.
fn device_ordinal() -> i32 {
    match std::env::var(DEVICE_ENV) {
        Ok(text) => text
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{DEVICE_ENV}={text:?} is not a device ordinal")),
        Err(_) => 0,
    }
}

/// The pointer to pass for one kernel argument.
pub fn arg<T>(value: &mut T) -> *mut c_void {
    (value as *mut T).cast()
}

/// Device memory from `cuMemAlloc`, freed on drop.
pub struct DeviceBuffer {
    context: Arc<PrimaryContext>,
    ptr: CUdeviceptr,
    bytes: usize,
}

impl DeviceBuffer {
    /// The device address.
    pub fn ptr(&self) -> CUdeviceptr {
        self.ptr
    }

    /// The size in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Copies `data` to the start of the buffer (`cuMemcpyHtoD`, synchronous).
    pub fn upload(&self, data: &[u32]) -> Result<(), Error> {
        let bytes = std::mem::size_of_val(data);
        assert!(
            bytes <= self.bytes,
            "{bytes} bytes do not fit in {}",
            self.bytes
        );
        self.context.bind()?;
        let api = self.context.api();
        // SAFETY: `data` is valid for `bytes` reads and the buffer for `bytes` writes.
        unsafe { cu!(api, cuMemcpyHtoD(self.ptr, data.as_ptr().cast(), bytes)) }
    }

    /// Copies the whole buffer back as `u32`s (`cuMemcpyDtoH`, synchronous).
    pub fn download(&self) -> Result<Vec<u32>, Error> {
        let mut out = vec![0u32; self.bytes / 4];
        let bytes = std::mem::size_of_val(out.as_slice());
        self.context.bind()?;
        let api = self.context.api();
        // SAFETY: `out` is valid for `bytes` writes and the buffer for `bytes` reads.
        unsafe { cu!(api, cuMemcpyDtoH(out.as_mut_ptr().cast(), self.ptr, bytes)) }?;
        Ok(out)
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // A lost context fails the free; the memory went with the context, nothing to do.
        if self.context.bind().is_ok() {
            let api = self.context.api();
            // SAFETY: `ptr` came from cuMemAlloc in this context and is freed once.
            let _ = unsafe { cu!(api, cuMemFree(self.ptr)) };
        }
    }
}

/// A loaded module (`cuhal-sys`'s, unloaded on drop) whose kernels borrow it.
pub struct Module(cuhal_sys::Module);

impl Module {
    /// The kernel `name` (`cuModuleGetFunction`).
    pub fn function(&self, name: &str) -> Result<Function<'_>, Error> {
        Ok(Function {
            raw: self.0.function(name)?,
            _module: PhantomData,
        })
    }
}

/// A kernel of a [`Module`], valid while the module is.
pub struct Function<'m> {
    raw: CUfunction,
    _module: PhantomData<&'m Module>,
}

impl Function<'_> {
    /// The raw handle.
    pub fn raw(&self) -> CUfunction {
        self.raw
    }
}

/// A module that failed to load, with what the JIT compiler said.
#[derive(Debug)]
pub struct ModuleError {
    /// The failed driver call.
    pub error: Error,
    /// The JIT's error log (empty if it wrote none).
    pub log: String,
}

impl ModuleError {
    /// The driver's status code.
    pub fn result(&self) -> Option<CUresult> {
        self.error.result()
    }
}

impl fmt::Display for ModuleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.error)?;
        if !self.log.is_empty() {
            write!(f, "\nJIT log:\n{}", self.log)?;
        }
        Ok(())
    }
}

impl std::error::Error for ModuleError {}

/// This run's random seed: `CUHAL_TEST_SEED` if set, else from the clock. Printed, so a
/// failing run can be repeated.
pub fn seed() -> u64 {
    let seed = match std::env::var(SEED_ENV) {
        Ok(text) => text
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{SEED_ENV}={text:?} is not a u64")),
        Err(_) => {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0);
            now ^ (u64::from(std::process::id()) << 32)
        }
    };
    println!("seed {seed} (set {SEED_ENV}={seed} to repeat)");
    seed
}

/// A small deterministic generator (SplitMix64): test data varies per run, yet a seed
/// reproduces it.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// The next 32 random bits.
    pub fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rng_is_reproducible_and_varies() {
        let a: Vec<u64> = {
            let mut r = Rng::new(7);
            (0..4).map(|_| r.next_u64()).collect()
        };
        let mut r = Rng::new(7);
        assert_eq!(a, (0..4).map(|_| r.next_u64()).collect::<Vec<_>>());
        let mut other = Rng::new(8);
        assert_ne!(a[0], other.next_u64());
        // SplitMix64's published first output for seed 0.
        assert_eq!(Rng::new(0).next_u64(), 0xE220_A839_7B1D_CDAF);
    }
}
