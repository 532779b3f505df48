//! Loads the CUDA driver at run time and lists its devices, or says what was missing.
//!
//! `cargo run -p cuhal-sys --example list_devices` (set `CUHAL_CUDA_LIBRARY` to use a driver
//! library that is not on the loader's path).

use cuhal_sys::{DriverApi, Error, devices, format_cuda_version};

fn main() {
    let api = match DriverApi::load() {
        Ok(api) => api,
        Err(error @ Error::LibraryNotFound { .. }) => {
            println!("no CUDA driver here: {error}");
            return;
        }
        Err(error) => {
            eprintln!("the CUDA driver could not be used: {error}");
            std::process::exit(1);
        }
    };
    println!(
        "CUDA driver {} from {}",
        format_cuda_version(api.driver_version()),
        api.library_path()
    );
    match devices(&api) {
        Ok(list) => {
            for device in list {
                println!(
                    "  {}: {} (compute {}.{}, {} MiB, {})",
                    device.ordinal,
                    device.name,
                    device.compute_capability.0,
                    device.compute_capability.1,
                    device.total_memory >> 20,
                    device.uuid_string()
                );
            }
        }
        Err(error) => eprintln!("listing devices failed: {error}"),
    }
}
