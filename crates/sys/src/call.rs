//! Calling the driver: each call is written once, with its name, and checked.
//!
//! See the crate documentation ("Calling the driver") for how to use [`cu!`](crate::cu) and
//! [`cu_name!`](crate::cu_name).

/// Calls a driver function of a [`DriverApi`](crate::DriverApi) table and checks its result,
/// naming the function once.
///
/// `cu!(api, cuX(args...))` calls the table's entry `cuX` with `args` and returns
/// `Result<(), cuhal_sys::Error>`: `Ok(())` for `CUDA_SUCCESS`, else an
/// [`Error::Cuda`](crate::Error::Cuda) whose `call` is `"cuX"`, with the driver's name and
/// description of the code. The name comes from the identifier, so it can neither be misspelled
/// nor drift from the function actually called (a misspelled one does not compile).
///
/// `api` is any expression that dereferences to a `DriverApi` (`&DriverApi`, `Arc<DriverApi>`,
/// `context.api()`); it is evaluated once, before the arguments.
///
/// Other forms:
/// - `cu!(ready: api, cuX(args...))` returns `Result<bool, Error>`: `Ok(true)` for
///   `CUDA_SUCCESS`, `Ok(false)` for `CUDA_ERROR_NOT_READY` (event and stream queries);
/// - `cu!(optional: api, cuX(args...))` calls an optional entry (one newer than the table's base
///   version) and returns `Result<(), Error>`, with [`Error::MissingSymbol`](crate::Error::MissingSymbol)
///   when the driver lacks it.
///
/// The call is `unsafe` (the caller upholds the function's contract from the CUDA driver API
/// reference), so the macro must be used inside an `unsafe` block, whose `// SAFETY:` comment
/// says why the arguments are valid:
///
/// ```no_run
/// # fn f(api: &cuhal_sys::DriverApi, stream: cuhal_sys::CUstream) -> Result<(), cuhal_sys::Error> {
/// // SAFETY: `stream` is a live stream of the current context.
/// unsafe { cuhal_sys::cu!(api, cuStreamSynchronize(stream)) }?;
/// # Ok(()) }
/// ```
#[macro_export]
macro_rules! cu {
    (ready: $api:expr, $name:ident ( $($arg:expr),* $(,)? )) => {{
        let api: &$crate::DriverApi = &$api;
        api.check_ready(::core::stringify!($name), (api.$name)($($arg),*))
    }};
    (optional: $api:expr, $name:ident ( $($arg:expr),* $(,)? )) => {{
        let api: &$crate::DriverApi = &$api;
        match api.$name {
            ::core::option::Option::Some(f) => api.check(::core::stringify!($name), f($($arg),*)),
            ::core::option::Option::None => {
                ::core::result::Result::Err(api.missing_symbol(::core::stringify!($name)))
            }
        }
    }};
    ($api:expr, $name:ident ( $($arg:expr),* $(,)? )) => {{
        let api: &$crate::DriverApi = &$api;
        api.check(::core::stringify!($name), (api.$name)($($arg),*))
    }};
}

/// The name of a driver function of the [`DriverApi`](crate::DriverApi) table, as a
/// `&'static str`, checked at compile time: `cu_name!(cuGraphLaunch)` is `"cuGraphLaunch"`,
/// and a name the table lacks does not compile.
///
/// For code that speaks of a call without making it: tests that steer a fake driver's fault
/// injection or compare an error's `call`, and messages.
///
/// ```
/// assert_eq!(cuhal_sys::cu_name!(cuGraphLaunch), "cuGraphLaunch");
/// ```
///
/// A function the table lacks (there is no `cuMemsetAsync`) is a compile error:
///
/// ```compile_fail
/// let _ = cuhal_sys::cu_name!(cuMemsetAsync);
/// ```
#[macro_export]
macro_rules! cu_name {
    ($name:ident) => {{
        // Never called: it only makes the compiler check that the table has the entry.
        let _ = |api: &$crate::DriverApi| {
            let _ = &api.$name;
        };
        ::core::stringify!($name)
    }};
}

/// Calls a function of an [`NcclApi`](crate::NcclApi) table and checks its result, naming the
/// function once: NCCL's counterpart of [`cu!`](crate::cu).
///
/// `nccl!(api, ncclX(args...))` calls the table's entry `ncclX` with `args` and returns
/// `Result<(), cuhal_sys::NcclError>`: `Ok(())` for `ncclSuccess`, else an
/// [`NcclError::Call`](crate::NcclError::Call) whose `call` is `"ncclX"`, with NCCL's words for
/// the result ([`NcclApi::check_call`](crate::NcclApi::check_call)). A name the table lacks does
/// not compile. `api` is any expression that dereferences to an `NcclApi`, evaluated once.
///
/// The call is `unsafe` (the caller upholds the function's contract from NCCL's documentation),
/// so the macro is used inside an `unsafe` block whose `// SAFETY:` comment says why the
/// arguments are valid:
///
/// ```no_run
/// # fn f(api: &cuhal_sys::NcclApi) -> Result<(), cuhal_sys::NcclError> {
/// // SAFETY: group calls take no arguments; the group is ended right after.
/// unsafe { cuhal_sys::nccl!(api, ncclGroupStart()) }?;
/// // SAFETY: ends the group started above.
/// unsafe { cuhal_sys::nccl!(api, ncclGroupEnd()) }
/// # }
/// ```
#[macro_export]
macro_rules! nccl {
    ($api:expr, $name:ident ( $($arg:expr),* $(,)? )) => {{
        let api: &$crate::NcclApi = &$api;
        api.check_call(::core::stringify!($name), (api.$name)($($arg),*))
    }};
}

/// The name of a function of the [`NcclApi`](crate::NcclApi) table, as a `&'static str`,
/// checked at compile time: `nccl_name!(ncclAllReduce)` is `"ncclAllReduce"`. With a literal
/// after it, the literal is appended: `nccl_name!(ncclCommGetAsyncError, " (asynchronous
/// error)")`, for an error that a call reported rather than returned.
///
/// For code that speaks of a call without making it (errors built by hand, tests steering the
/// fake NCCL, messages).
///
/// ```
/// assert_eq!(cuhal_sys::nccl_name!(ncclAllReduce), "ncclAllReduce");
/// assert_eq!(cuhal_sys::nccl_name!(ncclGroupEnd, " (late)"), "ncclGroupEnd (late)");
/// ```
///
/// A function the table lacks is a compile error:
///
/// ```compile_fail
/// let _ = cuhal_sys::nccl_name!(ncclAllToAll);
/// ```
#[macro_export]
macro_rules! nccl_name {
    ($name:ident $(, $suffix:literal)?) => {{
        // Never called: it only makes the compiler check that the table has the entry.
        let _ = |api: &$crate::NcclApi| {
            let _ = &api.$name;
        };
        ::core::concat!(::core::stringify!($name) $(, $suffix)?)
    }};
}
