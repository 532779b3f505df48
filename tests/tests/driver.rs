//! GPU suite, part 1: the driver itself. Load it, enumerate devices, retain the primary
//! context, JIT a PTX module, launch a kernel, check every element it wrote.

use cuhal_sys::{cu, cu_name};
use std::ffi::c_uint;

use cuhal_gpu_tests::gpu::{Gpu, Rng, arg, seed};
use cuhal_gpu_tests::kernels;
use cuhal_sys::{CUcontext, CUresult, DriverApi, TABLE_CUDA_VERSION};

#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn the_driver_loads_and_is_new_enough() {
    let api = DriverApi::load().expect("the CUDA driver loads");
    println!(
        "{} (CUDA {})",
        api.library_path(),
        cuhal_sys::format_cuda_version(api.driver_version())
    );
    assert!(
        api.driver_version() >= TABLE_CUDA_VERSION,
        "driver CUDA {} is older than the table's",
        api.driver_version()
    );
    let mut version = 0;
    // SAFETY: `version` is a valid out-pointer.
    unsafe { cu!(api, cuDriverGetVersion(&mut version)) }.unwrap();
    assert_eq!(version, api.driver_version());
}

#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn devices_are_enumerated_with_their_facts() {
    let api = DriverApi::load().unwrap();
    let devices = cuhal_sys::devices(&api).unwrap();
    assert!(!devices.is_empty(), "the driver sees no device");
    assert_eq!(devices.len() as i32, cuhal_sys::device_count(&api).unwrap());
    for d in &devices {
        println!(
            "{}: {} sm_{}{} {} MiB {} {}",
            d.ordinal,
            d.name,
            d.compute_capability.0,
            d.compute_capability.1,
            d.total_memory >> 20,
            d.uuid_string(),
            d.pci_bus_id
        );
        assert!(!d.name.is_empty());
        assert!(
            d.compute_capability.0 >= 5,
            "compute capability {:?}",
            d.compute_capability
        );
        assert!(d.total_memory >= 1 << 30, "{} bytes", d.total_memory);
        assert!(d.multiprocessors > 0);
        assert_ne!(d.uuid.bytes, [0; 16], "an all-zero UUID");
        // dddd:bb:dd.f, hexadecimal.
        let parts: Vec<&str> = d.pci_bus_id.split([':', '.']).collect();
        assert_eq!(parts.len(), 4, "{}", d.pci_bus_id);
        assert!(
            parts
                .iter()
                .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_hexdigit()))
        );
    }
    // Distinct devices have distinct UUIDs.
    for (i, a) in devices.iter().enumerate() {
        assert!(devices[i + 1..].iter().all(|b| a.uuid != b.uuid));
    }
    // An ordinal past the end is an error, not a panic.
    let err = cuhal_sys::device_info(&api, devices.len() as i32).unwrap_err();
    assert_eq!(err.result(), Some(CUresult::ERROR_INVALID_DEVICE), "{err}");
}

#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn the_primary_context_is_retained_current_and_released() {
    let gpu = Gpu::open();
    let api = gpu.api();
    let state = |api: &DriverApi| {
        let (mut flags, mut active): (c_uint, i32) = (0, 0);
        // SAFETY: valid out-pointers; the device handle came from cuDeviceGet.
        unsafe {
            cu!(
                api,
                cuDevicePrimaryCtxGetState(gpu.context().device(), &mut flags, &mut active)
            )
        }
        .unwrap();
        active
    };
    assert_eq!(state(api), 1, "retained primary context is active");

    let mut current: CUcontext = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    unsafe { cu!(api, cuCtxGetCurrent(&mut current)) }.unwrap();
    assert_eq!(
        current,
        gpu.context().raw(),
        "the fixture made its context current"
    );

    // Another thread binds it too (cuhal's worker threads do this).
    let ctx = gpu.context().clone();
    std::thread::spawn(move || {
        ctx.bind().unwrap();
        let mut current: CUcontext = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        unsafe { cu!(ctx.api(), cuCtxGetCurrent(&mut current)) }.unwrap();
        assert_eq!(current, ctx.raw());
    })
    .join()
    .unwrap();

    // Dropping the only retain releases the primary context: it becomes inactive.
    let api = std::sync::Arc::clone(gpu.context().api());
    let device = gpu.context().device();
    drop(gpu);
    let (mut flags, mut active): (c_uint, i32) = (0, 1);
    // SAFETY: valid out-pointers.
    unsafe {
        cu!(
            api,
            cuDevicePrimaryCtxGetState(device, &mut flags, &mut active)
        )
    }
    .unwrap();
    assert_eq!(active, 0, "the primary context was not released");
}

#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn the_fill_kernel_writes_every_element_and_nothing_else() {
    let gpu = Gpu::open();
    let mut rng = Rng::new(seed());
    // Not a multiple of the block size, so the last block's bounds check matters; a guard
    // region after `n` must keep its poison.
    const BLOCK: u32 = 256;
    const N: u32 = (1 << 20) + 37;
    const GUARD: u32 = 1024;
    let poison = rng.next_u32();
    let value = loop {
        let v = rng.next_u32();
        if v != poison {
            break v;
        }
    };
    println!("poison {poison:#010x}, value {value:#010x}");

    let buffer = gpu.alloc(((N + GUARD) * 4) as usize).unwrap();
    buffer.upload(&vec![poison; (N + GUARD) as usize]).unwrap();
    assert!(
        buffer.download().unwrap().iter().all(|&x| x == poison),
        "poisoning failed"
    );

    let module = gpu
        .load_ptx(kernels::FILL_U32)
        .unwrap_or_else(|e| panic!("{e}"));
    let fill = module.function(kernels::FILL_U32_NAME).unwrap();
    let (mut ptr, mut v, mut n) = (buffer.ptr(), value, N);
    let mut params = [arg(&mut ptr), arg(&mut v), arg(&mut n)];
    // SAFETY: fill_u32(u64 ptr, u32 value, u32 n): three parameters of those types; the
    // buffer holds N + GUARD u32s and the kernel writes only the first N.
    unsafe { gpu.launch_1d(&fill, N, BLOCK, &mut params) }.unwrap();

    let out = buffer.download().unwrap();
    let (filled, guard) = out.split_at(N as usize);
    if let Some(i) = filled.iter().position(|&x| x != value) {
        panic!("element {i} is {:#010x}, expected {value:#010x}", filled[i]);
    }
    if let Some(i) = guard.iter().position(|&x| x != poison) {
        panic!(
            "guard element {} was overwritten with {:#010x}",
            N as usize + i,
            guard[i]
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn bad_ptx_returns_the_jit_error_log() {
    let gpu = Gpu::open();
    let err = match gpu.load_ptx(kernels::BAD_PTX) {
        Ok(_) => panic!("broken PTX loaded"),
        Err(e) => e,
    };
    println!("{err}");
    assert_eq!(err.result(), Some(CUresult::ERROR_INVALID_PTX), "{err}");
    assert!(!err.log.is_empty(), "the JIT wrote no error log");
    assert!(
        err.log.contains(kernels::BAD_PTX_TOKEN) || err.log.contains("line 8"),
        "{}",
        err.log
    );
    assert!(err.to_string().contains(&err.log));

    // The context is still usable afterwards: a JIT error is not sticky.
    let module = gpu
        .load_ptx(kernels::FILL_U32)
        .unwrap_or_else(|e| panic!("{e}"));
    module.function(kernels::FILL_U32_NAME).unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn a_missing_kernel_name_is_an_error() {
    let gpu = Gpu::open();
    let module = gpu
        .load_ptx(kernels::FILL_U32)
        .unwrap_or_else(|e| panic!("{e}"));
    let err = module
        .function("no_such_kernel")
        .err()
        .expect("found a kernel that does not exist");
    assert_eq!(err.result(), Some(CUresult::ERROR_NOT_FOUND), "{err}");
    assert!(err.to_string().contains(cu_name!(cuModuleGetFunction)));
}
