//! `cuhal info`: the driver and each device, or one clear line saying why there are none.

use cuhal_sys::cu_name;
use std::fmt::Write as _;

use cuhal_sys::{CUresult, DeviceInfo, DriverApi, Error, PeerLink};

use crate::exit;

/// Prints the report and returns the exit code.
pub fn run() -> u8 {
    let api = match DriverApi::load() {
        Ok(api) => api,
        Err(error) => {
            let (code, line) = load_failure(&error);
            eprintln!("cuhal: {line}");
            return code;
        }
    };
    match cuhal_sys::devices(&api) {
        Ok(devices) => {
            print!("{}", report(&api, &devices));
            if devices.len() > 1 {
                match cuhal_sys::topology(&api) {
                    Ok(links) => print!("{}", topology_report(&links)),
                    Err(error) => eprintln!("cuhal: reading the topology failed: {error}"),
                }
            }
            if devices.is_empty() {
                exit::NO_DEVICE
            } else {
                exit::OK
            }
        }
        Err(error) => {
            print!("{}", report(&api, &[]));
            eprintln!("cuhal: reading the devices failed: {error}");
            exit::FAILURE
        }
    }
}

/// The exit code and the one line to print when the driver did not load.
fn load_failure(error: &Error) -> (u8, String) {
    match error {
        // The error's text lists every path tried and names CUHAL_CUDA_LIBRARY.
        Error::LibraryNotFound { .. } => {
            (exit::NO_DRIVER, format!("no CUDA driver found: {error}"))
        }
        Error::Cuda { call, result, .. }
            if *call == cu_name!(cuInit) && *result == CUresult::ERROR_NO_DEVICE =>
        {
            (
                exit::NO_DEVICE,
                format!("a CUDA driver was found but it sees no device: {error}"),
            )
        }
        _ => (
            exit::FAILURE,
            format!("the CUDA driver could not be used: {error}"),
        ),
    }
}

/// The text `cuhal info` prints for a loaded driver.
fn report(api: &DriverApi, devices: &[DeviceInfo]) -> String {
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = writeln!(
        out,
        "CUDA driver {} ({})",
        cuhal_sys::format_cuda_version(api.driver_version()),
        api.library_path()
    );
    if devices.is_empty() {
        out.push_str("no CUDA devices\n");
    }
    for d in devices {
        let _ = writeln!(out, "device {}: {}", d.ordinal, d.name);
        let _ = writeln!(
            out,
            "  compute capability {}.{}, {} multiprocessors",
            d.compute_capability.0, d.compute_capability.1, d.multiprocessors
        );
        let _ = writeln!(
            out,
            "  memory {} ({} bytes)",
            gib(d.total_memory),
            d.total_memory
        );
        let _ = writeln!(out, "  uuid {}", d.uuid_string());
        let _ = writeln!(out, "  pci bus id {}", d.pci_bus_id);
    }
    out
}

/// The peer links between devices, one line per ordered pair.
fn topology_report(links: &[PeerLink]) -> String {
    let mut out = String::from("topology (source -> destination):\n");
    for link in links {
        // Writing to a String cannot fail.
        let _ = writeln!(
            out,
            "  {} -> {}: peer access {}, link {}, native atomics {}, performance rank {}",
            link.source,
            link.destination,
            if link.access { "yes" } else { "no" },
            link.kind().name(),
            if link.native_atomics { "yes" } else { "no" },
            link.performance_rank
        );
    }
    out
}

/// `139.8 GiB`.
fn gib(bytes: usize) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cuhal_sys::LoadAttempt;

    #[test]
    fn a_missing_library_is_exit_2_with_the_fix() {
        let error = Error::LibraryNotFound {
            tried: vec![LoadAttempt {
                path: "libcuda.so.1".into(),
                reason: "not found".into(),
            }],
        };
        let (code, line) = load_failure(&error);
        assert_eq!(code, exit::NO_DRIVER);
        assert!(
            line.contains("libcuda.so.1") && line.contains("CUHAL_CUDA_LIBRARY"),
            "{line}"
        );
        assert!(!line.contains('\n'));
    }

    #[test]
    fn no_device_at_init_is_exit_3_and_other_failures_exit_1() {
        let cuda = |call, result| Error::Cuda {
            call,
            result,
            name: String::new(),
            description: String::new(),
        };
        assert_eq!(
            load_failure(&cuda(cu_name!(cuInit), CUresult::ERROR_NO_DEVICE)).0,
            exit::NO_DEVICE
        );
        assert_eq!(
            load_failure(&cuda(cu_name!(cuInit), CUresult::ERROR_UNKNOWN)).0,
            exit::FAILURE
        );
        let missing = Error::MissingSymbol {
            symbol: cu_name!(cuGraphLaunch),
            library: "libcuda.so.1".into(),
            driver_version: Some(11040),
        };
        let (code, line) = load_failure(&missing);
        assert_eq!(code, exit::FAILURE);
        assert!(line.contains(cu_name!(cuGraphLaunch)), "{line}");
    }

    #[test]
    fn topology_names_each_pair_its_link_and_rank() {
        let link = |source, destination, access, native_atomics| PeerLink {
            source,
            destination,
            access,
            native_atomics,
            performance_rank: 1,
        };
        let text = topology_report(&[link(0, 1, true, true), link(1, 0, true, false)]);
        assert!(
            text.contains(
                "0 -> 1: peer access yes, link nvlink, native atomics yes, performance rank 1"
            ),
            "{text}"
        );
        assert!(
            text.contains("1 -> 0: peer access yes, link pcie"),
            "{text}"
        );
        let none = topology_report(&[link(0, 1, false, false)]);
        assert!(none.contains("peer access no, link none"), "{none}");
    }

    #[test]
    fn memory_is_shown_in_gib() {
        assert_eq!(gib(16 << 30), "16.0 GiB");
        assert_eq!(gib(150_119_546_880), "139.8 GiB");
    }
}
