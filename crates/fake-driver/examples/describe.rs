//! Loads the fake driver through cuhal-sys, as a test would, and prints what it reports.
//!
//! ```sh
//! cargo run -p cuhal-fake-driver --example describe
//! CUHAL_FAKE_DEVICES=2 CUHAL_FAKE_FAIL=cuInit=100 cargo run -p cuhal-fake-driver --example describe
//! ```

use std::path::PathBuf;

fn main() {
    let name = format!(
        "{}cuhal_fake_driver{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    );
    // Examples live in target/<profile>/examples; the library in target/<profile>[/deps].
    let exe = std::env::current_exe().unwrap_or_default();
    let profile_dir = exe
        .parent()
        .and_then(|p| p.parent())
        .map(PathBuf::from)
        .unwrap_or_default();
    let Some(path) = [
        profile_dir.join(&name),
        profile_dir.join("deps").join(&name),
    ]
    .into_iter()
    .find(|p| p.exists()) else {
        eprintln!("{name} was not found under {}", profile_dir.display());
        std::process::exit(1);
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
