//! Loads the fake driver through cuhal-sys, as a test would, and prints what it reports.
//!
//! ```sh
//! cargo run -p cuhal-fake-driver --example describe
//! CUHAL_FAKE_DEVICES=2 CUHAL_FAKE_FAIL=cuInit=100 cargo run -p cuhal-fake-driver --example describe
//! ```

fn main() {
    let path = match cuhal_fake_driver::harness::FakeDriver::built_library() {
        Ok(path) => path,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };

    match cuhal_sys::DriverApi::load_from(&path) {
        Ok(api) => {
            println!(
                "loaded {} (CUDA {})",
                api.library_path(),
                cuhal_sys::format_cuda_version(api.driver_version())
            );
            match cuhal_sys::devices(&api) {
                Ok(devices) => {
                    for d in devices {
                        println!("  {}: {} ({})", d.ordinal, d.name, d.uuid_string());
                    }
                }
                Err(e) => println!("  devices: {e}"),
            }
        }
        Err(e) => println!("load failed: {e}"),
    }
}
