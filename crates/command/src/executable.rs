//! Executables: modules loaded from PTX (compiled by the driver's JIT) or cubin, and their
//! kernel functions with the attributes a dispatch is checked against.

use std::ffi::c_int;
use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use cuhal_sys::{
    CU_FUNC_ATTRIBUTE_BINARY_VERSION, CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES,
    CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
    CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, CU_FUNC_ATTRIBUTE_NUM_REGS,
    CU_FUNC_ATTRIBUTE_PTX_VERSION, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, CUfunction,
    CUfunction_attribute, CUmodule, Module, PrimaryContext, cu,
};

use crate::capabilities::LaunchCapabilities;
use crate::image::check_image;
use crate::param_count::ImageParameters;
use crate::{Error, KernelArgs};

/// A loaded module (`cuModuleLoadDataEx`).
///
/// Functions looked up from it keep it loaded, as do command buffers that record them.
#[derive(Clone)]
pub struct Executable {
    module: Arc<Module>,
    /// What the loaded image says of each kernel's parameters (see `param_count.rs`): lets a
    /// driver without `cuFuncGetParamCount` be asked for exactly the parameters there are, and is
    /// what a layout the caller states is checked against where the driver cannot report one.
    parameters: Arc<[(String, ImageParameters)]>,
}

impl Executable {
    /// Compiles and loads PTX text. A compile error is an [`Error::ModuleLoad`] whose `log` is
    /// the JIT's error log.
    pub fn load_ptx(context: &Arc<PrimaryContext>, ptx: &str) -> Result<Self, Error> {
        Ok(Self {
            module: Arc::new(Module::load_ptx(context, ptx)?),
            parameters: crate::param_count::ptx_parameter_layouts(ptx).into(),
        })
    }

    /// Loads a cubin (ELF), fatbin or NUL-terminated PTX image.
    ///
    /// The driver takes the image without its length and reads as far as its headers say, so
    /// the headers are checked against the slice first (see [`check_image`]): an image whose
    /// declared extent passes the end of the slice is refused with [`Error::BadImage`] and never
    /// reaches the driver.
    pub fn load_cubin(context: &Arc<PrimaryContext>, image: &[u8]) -> Result<Self, Error> {
        check_image(image).map_err(|reason| Error::BadImage { reason })?;
        Ok(Self {
            module: Arc::new(Module::load_cubin(context, image)?),
            parameters: crate::param_count::image_parameter_layouts(image).into(),
        })
    }

    /// Loads a cubin once per context, under `key`, and keeps it loaded until the context is
    /// released ([`PrimaryContext::resident_module`]); later calls for the same context and key
    /// return the module already loaded (the image then only gives the parameter counts).
    ///
    /// For cuhal's own helper kernels: loading and unloading a module waits for all work running
    /// in the context, so a module per command buffer would make recording and dropping wait.
    pub fn load_cubin_resident(
        context: &Arc<PrimaryContext>,
        key: &'static str,
        image: &[u8],
    ) -> Result<Self, Error> {
        check_image(image).map_err(|reason| Error::BadImage { reason })?;
        let module = context.resident_module(key, |context| Module::load_cubin(context, image))?;
        Ok(Self {
            module: Arc::new(module),
            parameters: crate::param_count::image_parameter_layouts(image).into(),
        })
    }

    /// The JIT's informational log from loading (register use and the like; may be empty).
    pub fn info_log(&self) -> &str {
        self.module.info_log()
    }

    /// The raw module handle.
    pub fn raw(&self) -> CUmodule {
        self.module.raw()
    }

    /// The context the module is loaded in.
    pub fn context(&self) -> &Arc<PrimaryContext> {
        self.module.context()
    }

    /// How many parameters the kernel `name` takes, as the loaded image states it (`None` where
    /// it does not: a name the image reader did not find, a fatbin with compressed entries, a
    /// cubin without the kernel's `.nv.info` records).
    pub fn parameter_count(&self, name: &str) -> Option<usize> {
        self.image_parameters(name)
            .map(|parameters| parameters.count)
    }

    /// What the loaded image says of the parameters of the kernel `name`.
    fn image_parameters(&self, name: &str) -> Option<&ImageParameters> {
        self.parameters
            .iter()
            .find(|(kernel, _)| kernel == name)
            .map(|(_, parameters)| parameters)
    }

    /// Looks up a kernel by its (mangled) name and reads its attributes.
    pub fn function(&self, name: &str) -> Result<Function, Error> {
        let context = self.module.context();
        let api = context.api();
        let raw = self.module.function(name).map_err(|e| match e {
            cuhal_sys::Error::Cuda { .. } => Error::UnknownFunction {
                name: name.to_owned(),
                source: e,
            },
            other => Error::from(other),
        })?;
        let _bound = context.enter()?;
        let get = |attribute: CUfunction_attribute| -> Result<u32, Error> {
            let mut value: c_int = 0;
            // SAFETY: `value` is a valid out-pointer; `raw` is a function of a loaded module.
            unsafe { cu!(api, cuFuncGetAttribute(&mut value, attribute, raw)) }?;
            Ok(value.max(0) as u32)
        };
        let attributes = FunctionAttributes {
            max_threads_per_block: get(CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
            registers: get(CU_FUNC_ATTRIBUTE_NUM_REGS)?,
            static_shared_bytes: get(CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)?,
            local_bytes_per_thread: get(CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)?,
            const_bytes: get(CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES)?,
            ptx_version: get(CU_FUNC_ATTRIBUTE_PTX_VERSION)?,
            binary_version: get(CU_FUNC_ATTRIBUTE_BINARY_VERSION)?,
        };
        let max_dynamic_shared = get(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)?;
        let capabilities = crate::capabilities::read_capabilities(api, context, raw)?;
        let image = self.image_parameters(name);
        let layout = parameter_layout(api, raw, image.map(|image| image.count));
        let parameters: Option<Box<[usize]>> = layout
            .as_ref()
            .map(|l| l.iter().map(|&(_, size)| size).collect());
        let offsets: Option<Box<[usize]>> =
            layout.map(|l| l.iter().map(|&(offset, _)| offset).collect());
        // The driver's report where it has one, else the image's.
        let declared = match &parameters {
            Some(sizes) => Some(ImageParameters {
                count: sizes.len(),
                sizes: Some(sizes.to_vec()),
            }),
            None => image.cloned(),
        };
        Ok(Function {
            inner: Arc::new(FunctionInner {
                module: Arc::clone(&self.module),
                raw,
                name: name.into(),
                attributes,
                max_dynamic_shared: AtomicU32::new(max_dynamic_shared),
                raise: Mutex::new(()),
                parameters,
                offsets,
                declared,
                capabilities,
            }),
        })
    }
}

impl fmt::Debug for Executable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Executable")
            .field("module", &self.module.raw())
            .finish()
    }
}

/// What the driver reports about a kernel (`cuFuncGetAttribute`), read once at lookup.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub struct FunctionAttributes {
    /// Most threads per block a launch may use (limited by `.maxntid` and register use).
    pub max_threads_per_block: u32,
    /// Registers per thread.
    pub registers: u32,
    /// Statically allocated shared memory per block, in bytes.
    pub static_shared_bytes: u32,
    /// Local memory per thread, in bytes.
    pub local_bytes_per_thread: u32,
    /// Constant memory, in bytes.
    pub const_bytes: u32,
    /// The PTX virtual architecture the kernel was compiled from (its `.target`), as
    /// major * 10 + minor (75 for `sm_75`).
    pub ptx_version: u32,
    /// Binary architecture, times 10 (90 for sm_90).
    pub binary_version: u32,
}

struct FunctionInner {
    module: Arc<Module>,
    raw: CUfunction,
    name: Box<str>,
    attributes: FunctionAttributes,
    max_dynamic_shared: AtomicU32,
    /// Held while raising `max_dynamic_shared`, so two recordings never lower it.
    raise: Mutex<()>,
    /// What the device and driver allow for launch attributes.
    capabilities: LaunchCapabilities,
    /// Each parameter's size in bytes, when the driver can say (CUDA 12.4 and later) or the
    /// caller stated them: what dispatches are checked against.
    parameters: Option<Box<[usize]>>,
    /// Each parameter's offset in the kernel's parameter buffer, as the driver reports it (CUDA
    /// 12.4 and later): where a patch applied on the device writes an argument. `None` where
    /// the driver cannot say.
    offsets: Option<Box<[usize]>>,
    /// What the driver reports of the parameters or, where it cannot, what the module image
    /// declares: what a stated layout is checked against. `None`: neither says.
    declared: Option<ImageParameters>,
}

/// The offset and size of each of `function`'s parameters through `cuFuncGetParamInfo`, or
/// `None` if the driver lacks it or cannot answer for this function.
///
/// The count comes from `cuFuncGetParamCount` where the driver has it, else from the loaded
/// image (`image_count`, see `param_count.rs`); either way no call fails. Only when neither
/// knows (a fatbin on a driver without `cuFuncGetParamCount`) is the driver probed index by
/// index until `CUDA_ERROR_INVALID_VALUE` marks the end: that one failing call per kernel is
/// expected, but compute-sanitizer reports it as an API error.
fn parameter_layout(
    api: &cuhal_sys::DriverApi,
    function: CUfunction,
    image_count: Option<usize>,
) -> Option<Box<[(usize, usize)]>> {
    let size_of = |index: usize| {
        let (mut offset, mut size) = (0usize, 0usize);
        // SAFETY: `function` is a function of a loaded module; both out-pointers are valid.
        unsafe { cu!(optional: api, cuFuncGetParamInfo(function, index, &mut offset, &mut size)) }
            .map(|()| (offset, size))
    };
    if api.cuFuncGetParamCount.is_some() {
        let mut count = 0usize;
        // SAFETY: `function` is a function of a loaded module; the out-pointer is valid.
        if unsafe { cu!(optional: api, cuFuncGetParamCount(function, &mut count)) }.is_err()
            || count > MAX_PARAMETER_BYTES
        {
            return None;
        }
        return (0..count).map(|index| size_of(index).ok()).collect();
    }
    if let Some(count) = image_count.filter(|&count| count <= MAX_PARAMETER_BYTES) {
        // `cuFuncGetParamInfo` itself may be missing (before CUDA 12.4): then `None`.
        api.cuFuncGetParamInfo?;
        return (0..count).map(|index| size_of(index).ok()).collect();
    }
    let mut layout = Vec::new();
    // A kernel has at most 32,764 bytes of parameters, so at most that many parameters.
    for index in 0..MAX_PARAMETER_BYTES {
        match size_of(index) {
            Ok(parameter) => layout.push(parameter),
            // Past the last parameter.
            Err(e) if e.result() == Some(cuhal_sys::CUresult::ERROR_INVALID_VALUE) => {
                return Some(layout.into());
            }
            // The driver lacks the entry (before CUDA 12.4) or cannot say for this function.
            Err(_) => return None,
        }
    }
    None
}

/// The most bytes of kernel parameters a launch may pass (CUDA 12.1 and later, Volta and later).
pub const MAX_PARAMETER_BYTES: usize = 32_764;

/// Checks a dispatch's arguments against the kernel's parameters: their total size always, their
/// count and sizes when the driver reports the kernel's parameters.
pub(crate) fn validate_arguments(
    function: &str,
    parameters: Option<&[usize]>,
    args: &KernelArgs,
) -> Result<(), Error> {
    if args.bytes().len() > MAX_PARAMETER_BYTES {
        return Err(Error::BadKernelArgument {
            reason: "more than 32,764 bytes of kernel arguments",
        });
    }
    let Some(parameters) = parameters else {
        // Without the layout the driver would read as many bytes as the kernel takes, however
        // few were given.
        return Err(Error::UnknownParameters {
            function: function.to_owned(),
        });
    };
    let slots = args.slots();
    if slots.len() != parameters.len() {
        return Err(Error::ArgumentMismatch {
            function: function.to_owned(),
            index: None,
            expected: parameters.len(),
            found: slots.len(),
        });
    }
    for (index, (slot, &size)) in slots.iter().zip(parameters.iter()).enumerate() {
        if slot.size as usize != size {
            return Err(Error::ArgumentMismatch {
                function: function.to_owned(),
                index: Some(index),
                expected: size,
                found: slot.size as usize,
            });
        }
    }
    Ok(())
}

// SAFETY: a CUfunction may be launched and queried from any thread; attribute updates go
// through the driver (thread safe) and an atomic.
unsafe impl Send for FunctionInner {}
// SAFETY: as above.
unsafe impl Sync for FunctionInner {}

/// A kernel of an [`Executable`]. Cheap to clone; keeps its module loaded.
#[derive(Clone)]
pub struct Function {
    inner: Arc<FunctionInner>,
}

impl Function {
    /// Each parameter's size in bytes, as the driver reports it (`cuFuncGetParamInfo`, CUDA 12.4
    /// drivers and later); `None` when the driver cannot say, and then dispatches are checked
    /// only for their total argument size.
    pub fn parameter_sizes(&self) -> Option<&[usize]> {
        self.inner.parameters.as_deref()
    }

    /// Each parameter's byte offset in the kernel's parameter buffer, as the driver reports it
    /// (`cuFuncGetParamInfo`, CUDA 12.4 and later), or `None` where it cannot say. It may differ
    /// from where [`KernelArgs`](crate::KernelArgs) packed an argument whose type is less aligned
    /// than the parameter (a `float4` pushed as `[f32; 4]`).
    pub fn parameter_offsets(&self) -> Option<&[usize]> {
        self.inner.offsets.as_deref()
    }

    /// This kernel with its parameters stated by the caller: each parameter's size in bytes, in
    /// order. Needed to dispatch it where the driver cannot report them (before CUDA 12.4).
    ///
    /// The stated layout must agree with what the driver reports or, where it cannot, with what
    /// the module image declares: the parameter count always, and each size where the image gives
    /// it (a PTX `.param`'s type, a cubin's `EIATTR_KPARAM_INFO` records); a disagreement is an
    /// [`Error::ArgumentMismatch`]. Where neither the driver nor the image says (a fatbin with
    /// compressed entries, a cubin without the kernel's `.nv.info` records), nothing could catch
    /// a wrong layout, and this is an [`Error::UnverifiableParameters`]: such a layout can only be
    /// stated through the `unsafe`
    /// [`with_parameter_sizes_unchecked`](Self::with_parameter_sizes_unchecked).
    ///
    /// The returned function has its own copy of the dynamic shared memory setting.
    pub fn with_parameter_sizes(&self, sizes: &[usize]) -> Result<Function, Error> {
        self.stated(sizes, true)
    }

    /// As [`with_parameter_sizes`](Self::with_parameter_sizes), but a layout that neither the
    /// driver nor the module image can check is taken on the caller's word; what either does say
    /// is still checked.
    ///
    /// # Safety
    ///
    /// `sizes` must be the kernel's parameters exactly: as many entries as the kernel takes
    /// parameters, each the size in bytes of the parameter at that index. Dispatches of the
    /// returned function are checked against `sizes` alone, and the driver reads as many argument
    /// bytes as the kernel really takes, so a wrong layout makes it read past the arguments a
    /// dispatch passes.
    pub unsafe fn with_parameter_sizes_unchecked(
        &self,
        sizes: &[usize],
    ) -> Result<Function, Error> {
        self.stated(sizes, false)
    }

    /// This kernel with the stated layout `sizes`, checked against what the driver or the image
    /// declares; `verified`: refused where neither declares anything.
    fn stated(&self, sizes: &[usize], verified: bool) -> Result<Function, Error> {
        let total = sizes
            .iter()
            .try_fold(0usize, |total, &size| total.checked_add(size));
        if total.is_none_or(|total| total > MAX_PARAMETER_BYTES) {
            return Err(Error::BadKernelArgument {
                reason: "more than 32,764 bytes of kernel parameters",
            });
        }
        let inner = &self.inner;
        let mismatch = |index, expected, found| Error::ArgumentMismatch {
            function: self.name().to_owned(),
            index,
            expected,
            found,
        };
        match &inner.declared {
            None if verified => {
                return Err(Error::UnverifiableParameters {
                    function: self.name().to_owned(),
                });
            }
            None => {}
            Some(declared) => {
                if sizes.len() != declared.count {
                    return Err(mismatch(None, declared.count, sizes.len()));
                }
                if let Some(expected) = &declared.sizes {
                    let differs = (0..sizes.len()).find(|&i| sizes[i] != expected[i]);
                    if let Some(index) = differs {
                        return Err(mismatch(Some(index), expected[index], sizes[index]));
                    }
                }
            }
        }
        Ok(Function {
            inner: Arc::new(FunctionInner {
                module: Arc::clone(&inner.module),
                raw: inner.raw,
                name: inner.name.clone(),
                attributes: inner.attributes,
                max_dynamic_shared: AtomicU32::new(
                    inner.max_dynamic_shared.load(Ordering::Relaxed),
                ),
                raise: Mutex::new(()),
                capabilities: inner.capabilities,
                parameters: Some(sizes.into()),
                offsets: inner.offsets.clone(),
                declared: inner.declared.clone(),
            }),
        })
    }

    /// The name it was looked up by.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The raw function handle.
    pub fn raw(&self) -> CUfunction {
        self.inner.raw
    }

    /// Attributes read at lookup.
    pub fn attributes(&self) -> FunctionAttributes {
        self.inner.attributes
    }

    /// The most dynamic shared memory a dispatch of this function may ask for, in bytes.
    ///
    /// Tracked per `Function` value (and its clones): a second lookup of the same name starts
    /// from the driver's current setting.
    pub fn max_dynamic_shared_memory(&self) -> u32 {
        self.inner.max_dynamic_shared.load(Ordering::Relaxed)
    }

    /// Raises (or lowers) the dynamic shared memory limit
    /// (`CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`); needed above 48 KiB.
    pub fn set_max_dynamic_shared_memory(&self, bytes: u32) -> Result<(), Error> {
        let context = &self.inner.module.context();
        let api = context.api();
        let value = c_int::try_from(bytes).map_err(|_| Error::SharedMemoryTooLarge {
            function: self.name().to_owned(),
            requested: bytes,
            max: c_int::MAX as u32,
        })?;
        let _bound = context.enter()?;
        // SAFETY: `raw` is a function of a loaded module; the attribute takes an int.
        unsafe {
            cu!(
                api,
                cuFuncSetAttribute(
                    self.inner.raw,
                    CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    value
                )
            )
        }?;
        self.inner
            .max_dynamic_shared
            .store(bytes, Ordering::Relaxed);
        Ok(())
    }

    /// What the device and driver allow this function's launches.
    pub(crate) fn capabilities(&self) -> &LaunchCapabilities {
        &self.inner.capabilities
    }

    /// The most dynamic shared memory the device lets a block of this function opt in to (the
    /// device's opt-in maximum less the kernel's static shared memory).
    pub fn max_dynamic_shared_memory_optin(&self) -> u32 {
        self.inner
            .capabilities
            .max_shared_optin
            .saturating_sub(self.inner.attributes.static_shared_bytes)
    }

    /// Makes sure a dispatch may use `bytes` of dynamic shared memory: raises the function's
    /// limit when it is lower (above 48 KiB the driver needs it), up to the device's opt-in
    /// maximum; beyond that it is an [`Error::SharedMemoryTooLarge`]. Never lowers the limit.
    pub fn ensure_dynamic_shared_memory(&self, bytes: u32) -> Result<(), Error> {
        if bytes <= self.max_dynamic_shared_memory() {
            return Ok(());
        }
        let max = self.max_dynamic_shared_memory_optin();
        if bytes > max {
            return Err(Error::SharedMemoryTooLarge {
                function: self.name().to_owned(),
                requested: bytes,
                max,
            });
        }
        // A poisoned lock only means another raise panicked; the limit is read again below.
        let _raising = self.inner.raise.lock().unwrap_or_else(|e| e.into_inner());
        if bytes <= self.max_dynamic_shared_memory() {
            return Ok(());
        }
        self.set_max_dynamic_shared_memory(bytes)
    }

    /// The limits a dispatch is checked against.
    pub(crate) fn limits(&self) -> DispatchLimits {
        DispatchLimits {
            max_threads_per_block: self.inner.attributes.max_threads_per_block,
            max_dynamic_shared: self.max_dynamic_shared_memory(),
        }
    }

    /// The context of the function's module.
    pub fn context(&self) -> &Arc<PrimaryContext> {
        self.inner.module.context()
    }

    pub(crate) fn same(&self, other: &Function) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    pub(crate) fn identity(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }
}

impl fmt::Debug for Function {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Function")
            .field("name", &self.inner.name)
            .field("attributes", &self.inner.attributes)
            .finish()
    }
}

/// Per-function limits of a dispatch.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct DispatchLimits {
    pub(crate) max_threads_per_block: u32,
    pub(crate) max_dynamic_shared: u32,
}

/// CUDA's grid limits per axis (every GPU since compute capability 3.0).
pub(crate) const MAX_GRID: [u32; 3] = [i32::MAX as u32, 65_535, 65_535];
/// CUDA's block limits per axis.
pub(crate) const MAX_BLOCK: [u32; 3] = [1024, 1024, 64];

/// Checks a dispatch's shape against CUDA's limits and the function's.
pub(crate) fn validate_dispatch(
    function: &str,
    limits: DispatchLimits,
    grid: [u32; 3],
    block: [u32; 3],
    shared_memory: u32,
) -> Result<(), Error> {
    let within =
        |dims: [u32; 3], max: [u32; 3]| dims.iter().zip(max).all(|(&d, m)| d >= 1 && d <= m);
    if !within(grid, MAX_GRID) {
        return Err(Error::BadDimension {
            what: "grid",
            dims: grid,
            max: MAX_GRID,
        });
    }
    if !within(block, MAX_BLOCK) {
        return Err(Error::BadDimension {
            what: "block",
            dims: block,
            max: MAX_BLOCK,
        });
    }
    let threads = u64::from(block[0]) * u64::from(block[1]) * u64::from(block[2]);
    if threads > u64::from(limits.max_threads_per_block) {
        return Err(Error::BlockTooLarge {
            function: function.to_owned(),
            block,
            max_threads: limits.max_threads_per_block,
        });
    }
    if shared_memory > limits.max_dynamic_shared {
        return Err(Error::SharedMemoryTooLarge {
            function: function.to_owned(),
            requested: shared_memory,
            max: limits.max_dynamic_shared,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_must_match_the_parameters_the_driver_reports() {
        let args = KernelArgs::new().with(1u64).with(2u32).with(3.0f32);
        assert_eq!(validate_arguments("k", Some(&[8, 4, 4]), &args), Ok(()));
        assert_eq!(
            validate_arguments("k", None, &args),
            Err(Error::UnknownParameters {
                function: "k".into()
            }),
            "an unknown layout is refused: the driver would read what it was not given"
        );
        assert_eq!(
            validate_arguments("k", Some(&[8, 4, 4, 8]), &args),
            Err(Error::ArgumentMismatch {
                function: "k".into(),
                index: None,
                expected: 4,
                found: 3
            })
        );
        assert_eq!(
            validate_arguments("k", Some(&[8, 16, 4]), &args),
            Err(Error::ArgumentMismatch {
                function: "k".into(),
                index: Some(1),
                expected: 16,
                found: 4
            })
        );
    }

    #[test]
    fn oversized_arguments_are_refused_whatever_the_driver_knows() {
        let mut args = KernelArgs::new();
        args.push_bytes(&vec![0u8; MAX_PARAMETER_BYTES + 1], 8)
            .unwrap();
        for parameters in [None, Some(&[MAX_PARAMETER_BYTES + 1][..])] {
            assert!(matches!(
                validate_arguments("k", parameters, &args),
                Err(Error::BadKernelArgument { .. })
            ));
        }
    }

    const LIMITS: DispatchLimits = DispatchLimits {
        max_threads_per_block: 256,
        max_dynamic_shared: 48 * 1024,
    };

    #[test]
    fn dispatch_within_limits_passes() {
        assert_eq!(
            validate_dispatch("k", LIMITS, [4096, 1, 1], [256, 1, 1], 0),
            Ok(())
        );
        assert_eq!(
            validate_dispatch("k", LIMITS, [1, 2, 3], [16, 16, 1], 48 * 1024),
            Ok(())
        );
    }

    #[test]
    fn block_above_the_functions_limit_is_rejected() {
        let e = validate_dispatch("scale", LIMITS, [1, 1, 1], [16, 16, 2], 0).unwrap_err();
        assert_eq!(
            e,
            Error::BlockTooLarge {
                function: "scale".into(),
                block: [16, 16, 2],
                max_threads: 256
            }
        );
        let text = e.to_string();
        assert!(
            text.contains("512 threads") && text.contains("256"),
            "{text}"
        );
    }

    #[test]
    fn zero_and_oversized_axes_are_rejected() {
        assert!(matches!(
            validate_dispatch("k", LIMITS, [0, 1, 1], [1, 1, 1], 0),
            Err(Error::BadDimension { what: "grid", .. })
        ));
        assert!(matches!(
            validate_dispatch("k", LIMITS, [1, 65_536, 1], [1, 1, 1], 0),
            Err(Error::BadDimension { what: "grid", .. })
        ));
        assert!(matches!(
            validate_dispatch("k", LIMITS, [1, 1, 1], [1, 1, 0], 0),
            Err(Error::BadDimension { what: "block", .. })
        ));
        assert!(matches!(
            validate_dispatch("k", LIMITS, [1, 1, 1], [1, 1, 65], 0),
            Err(Error::BadDimension { what: "block", .. })
        ));
    }

    #[test]
    fn shared_memory_above_the_setting_is_rejected() {
        assert!(matches!(
            validate_dispatch("k", LIMITS, [1, 1, 1], [1, 1, 1], 48 * 1024 + 1),
            Err(Error::SharedMemoryTooLarge {
                requested: 49153,
                max: 49152,
                ..
            })
        ));
    }
}
