//! What the examples share: a driver with a device to run on, or a word on why there is none.

use cuhal::Driver;

/// The CUDA driver, when it loads and lists a device; else `None`, having said why there is
/// nothing to run (an example without a GPU succeeds doing nothing).
pub fn driver_with_a_device() -> Option<Driver> {
    let driver = match Driver::load() {
        Ok(driver) => driver,
        Err(e) => {
            println!("no CUDA driver, so there is nothing to run: {e}");
            return None;
        }
    };
    match driver.devices() {
        Ok(devices) if !devices.is_empty() => Some(driver),
        Ok(_) => {
            println!("the CUDA driver sees no device, so there is nothing to run");
            None
        }
        Err(e) => {
            println!("the CUDA driver lists no device ({e}), so there is nothing to run");
            None
        }
    }
}
