//! [`LaunchCapabilities`]: what a function and its device allow (compute capability,
//! cooperative and cluster launches, shared memory, priorities), read once when the function
//! is looked up. `executable` stores it with each function; `launch` checks attributes
//! against it.

use std::ffi::c_int;

use cuhal_sys::DriverApi;

use crate::Error;

/// What a function's device and the driver allow, read once when the function is looked up.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub(crate) struct LaunchCapabilities {
    /// Compute capability (major, minor).
    pub(crate) compute_capability: (i32, i32),
    /// Multiprocessors on the device.
    pub(crate) multiprocessors: u32,
    /// `CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH`.
    pub(crate) cooperative: bool,
    /// `CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH`.
    pub(crate) clusters: bool,
    /// Dynamic plus static shared memory a block may opt in to.
    pub(crate) max_shared_optin: u32,
    /// The cluster the kernel was compiled for (`.reqnctapercluster`), if any.
    pub(crate) required_cluster: Option<[u32; 3]>,
    /// The kernel must be launched with a cluster.
    pub(crate) cluster_must_be_set: bool,
    /// The kernel may use clusters above the portable size.
    pub(crate) non_portable_cluster: bool,
    /// The context's stream priority range: (least, greatest); greatest <= least.
    pub(crate) priority_range: (i32, i32),
}

/// Reads what `function` and its device allow (see [`LaunchCapabilities`]). Attributes an older
/// driver does not know read as "not supported" rather than failing the lookup.
pub(crate) fn read_capabilities(
    api: &DriverApi,
    context: &cuhal_sys::PrimaryContext,
    function: cuhal_sys::CUfunction,
) -> Result<LaunchCapabilities, Error> {
    use cuhal_sys::*;
    let device = |attribute| context.attribute(attribute).unwrap_or(0);
    let function_attribute = |attribute| {
        let mut value: c_int = 0;
        // SAFETY: `value` is a valid out-pointer; `function` is a function of a loaded module.
        match unsafe { cu!(api, cuFuncGetAttribute(&mut value, attribute, function)) } {
            Ok(()) => value.max(0) as u32,
            Err(_) => 0,
        }
    };
    let required = [
        function_attribute(CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH),
        function_attribute(CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT),
        function_attribute(CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH),
    ];
    let (mut least, mut greatest) = (0, 0);
    // SAFETY: both out-pointers are valid locals; the context is current (the caller entered it).
    unsafe { cu!(api, cuCtxGetStreamPriorityRange(&mut least, &mut greatest)) }?;
    Ok(LaunchCapabilities {
        compute_capability: (
            context.attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            context.attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        ),
        multiprocessors: context
            .attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?
            .max(0) as u32,
        cooperative: device(CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH) != 0,
        clusters: device(CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH) != 0,
        max_shared_optin: device(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN).max(0)
            as u32,
        required_cluster: required.iter().all(|&d| d > 0).then_some(required),
        cluster_must_be_set: function_attribute(CU_FUNC_ATTRIBUTE_CLUSTER_SIZE_MUST_BE_SET) != 0,
        non_portable_cluster: function_attribute(
            CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED,
        ) != 0,
        priority_range: (least.max(greatest), greatest.min(least)),
    })
}
