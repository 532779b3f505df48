//! cuhal-sys's loader against the fake driver: real `dlopen`, real `cuGetProcAddress`.

mod common;

use common::Fake;
use cuhal_fake_driver::{driver, status};
use cuhal_sys::{CUresult, DriverApi, Error, TABLE_CUDA_VERSION};

#[test]
fn the_fake_exports_only_its_resolvers() {
    // The premise of the other tests: driver functions are reachable only through
    // cuGetProcAddress, so a working table proves the resolution path.
    let fake = Fake::new("exports");
    assert!(fake.exports("cuGetProcAddress_v2"));
    assert!(fake.exports("cuGetProcAddress"));
    for name in [
        "cuInit",
        "cuDriverGetVersion",
        "cuDeviceGetCount",
        "cuGetErrorName",
    ] {
        assert!(!fake.exports(name), "{name} is exported by name");
    }
    assert!(!Fake::without_v2("exports-v1").exports("cuGetProcAddress_v2"));
}

#[test]
fn every_entry_is_resolved_through_get_proc_address_v2() {
    let fake = Fake::new("v2");
    let api = DriverApi::load_from(&fake.path).expect("the fake driver loads");
    assert_eq!(api.library_path(), fake.path.display().to_string());
    assert_eq!(api.driver_version(), 13000);

    for name in DriverApi::REQUIRED_SYMBOLS {
        let (count, last) = fake.requested(name);
        assert!(count >= 1, "{name} was never requested");
        let last = last.unwrap();
        assert_eq!(
            last.via, 2,
            "{name} not resolved through cuGetProcAddress_v2"
        );
        // A symbol with a newer optional variant is asked for again under that version.
        if !DriverApi::OPTIONAL_SYMBOLS.contains(name) {
            assert_eq!(
                last.cuda_version, TABLE_CUDA_VERSION,
                "{name} requested for another ABI"
            );
        }
        assert_eq!(last.flags, 0, "{name} requested with flags");
    }
    for name in DriverApi::OPTIONAL_SYMBOLS {
        assert!(
            fake.requested(name).0 >= 1,
            "optional {name} was never requested"
        );
    }
    assert_eq!(
        fake.request_count(1),
        0,
        "the v1 resolver was used although v2 exists"
    );

    // The functions behind the table are the fake's: they answer with its devices.
    let devices = cuhal_sys::devices(&api).unwrap();
    assert_eq!(devices.len(), 1);
    assert_eq!(devices[0].name, driver::device_name(0));
    assert!(api.cuStreamGetId.is_some() && api.cuGraphDebugDotPrint.is_some());
}

#[test]
fn without_v2_the_v1_resolver_is_used() {
    let fake = Fake::without_v2("v1");
    fake.set_driver_version(11080);
    let api = DriverApi::load_from(&fake.path).expect("the fake driver loads through v1");
    assert_eq!(api.driver_version(), 11080);
    assert_eq!(fake.request_count(2), 0);
    assert!(fake.request_count(1) >= DriverApi::REQUIRED_SYMBOLS.len() as i32);
    let (_, last) = fake.requested("cuDeviceTotalMem");
    assert_eq!(last.unwrap().via, 1);
    assert_eq!(cuhal_sys::device_count(&api).unwrap(), 1);
}

#[test]
fn a_missing_required_symbol_is_named_with_the_driver_version() {
    for (fake, resolver) in [
        (Fake::new("missing-v2"), "v2"),
        (Fake::without_v2("missing-v1"), "v1"),
    ] {
        fake.hide("cuGraphLaunch");
        fake.set_driver_version(12040);
        let err = DriverApi::load_from(&fake.path).unwrap_err();
        assert_eq!(
            err,
            Error::MissingSymbol {
                symbol: "cuGraphLaunch",
                library: fake.path.display().to_string(),
                driver_version: Some(12040),
            },
            "through {resolver}"
        );
        let text = err.to_string();
        assert!(
            text.contains("cuGraphLaunch") && text.contains("CUDA 12.4"),
            "{text}"
        );
    }
}

#[test]
fn an_unknown_driver_version_is_reported_as_unknown() {
    let fake = Fake::new("no-version");
    fake.hide("cuDriverGetVersion");
    let err = DriverApi::load_from(&fake.path).unwrap_err();
    assert_eq!(
        err,
        Error::MissingSymbol {
            symbol: "cuDriverGetVersion",
            library: fake.path.display().to_string(),
            driver_version: None,
        }
    );
    assert!(err.to_string().contains("driver version unknown"), "{err}");
}

#[test]
fn a_missing_optional_symbol_is_none() {
    let fake = Fake::new("optional");
    fake.hide("cuStreamGetId");
    let api = DriverApi::load_from(&fake.path).expect("optional symbols may be missing");
    assert!(api.cuStreamGetId.is_none());
    assert!(api.cuGraphDebugDotPrint.is_some());
}

#[test]
fn a_library_without_get_proc_address_is_refused() {
    let fake = Fake::without_resolvers("noresolver");
    let err = DriverApi::load_from(&fake.path).unwrap_err();
    assert_eq!(
        err,
        Error::MissingSymbol {
            symbol: "cuGetProcAddress",
            library: fake.path.display().to_string(),
            driver_version: None,
        }
    );
}

#[test]
fn error_text_comes_from_the_driver() {
    let fake = Fake::new("errtext");
    let api = DriverApi::load_from(&fake.path).unwrap();
    // 34 is not in cuhal-sys's own table, so the name can only have come from the driver.
    assert_eq!(CUresult(status::STUB_LIBRARY).known_name(), None);
    fake.fail("cuDeviceGetCount", status::STUB_LIBRARY);
    assert_eq!(
        cuhal_sys::device_count(&api).unwrap_err(),
        Error::Cuda {
            call: "cuDeviceGetCount",
            result: CUresult(status::STUB_LIBRARY),
            name: "CUDA_ERROR_STUB_LIBRARY".into(),
            description: "CUDA driver is a stub library".into(),
        }
    );
    // A code the driver does not know either: the loader's fallbacks, not garbage.
    fake.fail("cuDeviceGetCount", 4242);
    match cuhal_sys::device_count(&api).unwrap_err() {
        Error::Cuda {
            result,
            name,
            description,
            ..
        } => {
            assert_eq!(result, CUresult(4242));
            assert_eq!(name, "CUresult(4242)");
            assert_eq!(description, "unrecognized error code");
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn a_failing_init_fails_the_load_with_the_drivers_words() {
    let fake = Fake::new("initfail");
    fake.fail("cuInit", status::NO_DEVICE);
    let err = DriverApi::load_from(&fake.path).unwrap_err();
    assert_eq!(
        err,
        Error::Cuda {
            call: "cuInit",
            result: CUresult::ERROR_NO_DEVICE,
            name: "CUDA_ERROR_NO_DEVICE".into(),
            description: "no CUDA-capable device is detected".into(),
        }
    );
    assert!(
        err.to_string()
            .starts_with("cuInit failed: CUDA_ERROR_NO_DEVICE (100)")
    );
}

#[test]
fn device_facts_are_read_for_every_device() {
    let fake = Fake::new("devices");
    fake.set_device_count(2);
    let api = DriverApi::load_from(&fake.path).unwrap();
    let devices = cuhal_sys::devices(&api).unwrap();
    assert_eq!(devices.len(), 2);
    for (i, d) in devices.iter().enumerate() {
        let i = i as i32;
        assert_eq!(d.ordinal, i);
        assert_eq!(d.name, driver::device_name(i));
        assert_eq!(d.compute_capability, driver::COMPUTE_CAPABILITY);
        assert_eq!(d.total_memory, driver::total_memory(i));
        assert_eq!(d.uuid.bytes, driver::uuid(i));
        assert_eq!(d.pci_bus_id, driver::pci_bus_id(i));
        assert_eq!(d.multiprocessors, driver::MULTIPROCESSORS);
    }
    assert_eq!(
        devices[1].uuid_string(),
        "GPU-face0000-0000-0000-0000-000000000001"
    );
    assert_eq!(devices[1].pci_bus_id, "0000:3c:00.0");

    fake.set_device_count(0);
    assert!(cuhal_sys::devices(&api).unwrap().is_empty());
}

#[test]
fn raw_symbols_are_resolved_for_the_version_asked() {
    let fake = Fake::new("raw");
    let api = DriverApi::load_from(&fake.path).unwrap();
    // The fake's cuFakeSince13 appeared in CUDA 13.0.
    assert!(api.raw_symbol("cuFakeSince13", 12000).is_none());
    assert!(api.raw_symbol("cuFakeSince13", 13000).is_some());
    let (_, last) = fake.requested("cuFakeSince13");
    assert_eq!(last.unwrap().cuda_version, 13000);
    fake.hide("cuSomethingElse");
    assert!(api.raw_symbol("cuSomethingElse", 13000).is_none());
    assert!(api.raw_symbol("bad\0name", 13000).is_none());
}
