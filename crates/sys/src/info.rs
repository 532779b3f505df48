//! What a device is: the facts `cuhal info` prints and a device crate logs at open.

use std::ffi::{CStr, c_char, c_int};

use crate::types::*;
use crate::{DriverApi, Error};

/// Identity and capabilities of one device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The ordinal passed to `cuDeviceGet`.
    pub ordinal: i32,
    /// The marketing name (`NVIDIA H200`).
    pub name: String,
    /// Compute capability (major, minor).
    pub compute_capability: (i32, i32),
    /// Total device memory in bytes.
    pub total_memory: usize,
    /// The device UUID.
    pub uuid: CUuuid,
    /// PCI bus id (`0000:3b:00.0`).
    pub pci_bus_id: String,
    /// Number of multiprocessors.
    pub multiprocessors: i32,
}

impl DeviceInfo {
    /// The UUID in the `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` form `nvidia-smi` prints.
    pub fn uuid_string(&self) -> String {
        let b = &self.uuid.bytes;
        let hex =
            |r: std::ops::Range<usize>| b[r].iter().map(|x| format!("{x:02x}")).collect::<String>();
        format!(
            "GPU-{}-{}-{}-{}-{}",
            hex(0..4),
            hex(4..6),
            hex(6..8),
            hex(8..10),
            hex(10..16)
        )
    }
}

/// The number of CUDA devices the driver sees.
pub fn device_count(api: &DriverApi) -> Result<i32, Error> {
    let mut count: c_int = 0;
    // SAFETY: `count` is a valid out-pointer.
    unsafe { crate::cu!(api, cuDeviceGetCount(&mut count)) }?;
    Ok(count)
}

/// Reads [`DeviceInfo`] for `ordinal`.
pub fn device_info(api: &DriverApi, ordinal: i32) -> Result<DeviceInfo, Error> {
    let mut device: CUdevice = 0;
    // SAFETY: `device` is a valid out-pointer.
    unsafe { crate::cu!(api, cuDeviceGet(&mut device, ordinal)) }?;

    let mut name = [0 as c_char; 256];
    // SAFETY: the driver writes at most `len` bytes including the NUL.
    unsafe {
        crate::cu!(
            api,
            cuDeviceGetName(name.as_mut_ptr(), name.len() as c_int, device)
        )
    }?;
    let attribute = |attribute| -> Result<i32, Error> {
        let mut value: c_int = 0;
        // SAFETY: `value` is a valid out-pointer; unknown attributes return an error code.
        unsafe { crate::cu!(api, cuDeviceGetAttribute(&mut value, attribute, device)) }?;
        Ok(value)
    };
    let mut total_memory = 0usize;
    // SAFETY: `total_memory` is a valid out-pointer.
    unsafe { crate::cu!(api, cuDeviceTotalMem(&mut total_memory, device)) }?;
    let mut uuid = CUuuid::default();
    // SAFETY: `uuid` is a valid 16-byte out-pointer.
    unsafe { crate::cu!(api, cuDeviceGetUuid(&mut uuid, device)) }?;
    let mut bus = [0 as c_char; 64];
    // SAFETY: the driver writes at most `len` bytes including the NUL.
    unsafe {
        crate::cu!(
            api,
            cuDeviceGetPCIBusId(bus.as_mut_ptr(), bus.len() as c_int, device)
        )
    }?;

    Ok(DeviceInfo {
        ordinal,
        name: c_text(&name),
        compute_capability: (
            attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        ),
        total_memory,
        uuid,
        pci_bus_id: c_text(&bus),
        multiprocessors: attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
    })
}

/// [`DeviceInfo`] for every device.
pub fn devices(api: &DriverApi) -> Result<Vec<DeviceInfo>, Error> {
    (0..device_count(api)?)
        .map(|i| device_info(api, i))
        .collect()
}

/// How one device reaches another (`cuDeviceGetP2PAttribute`, from `source` to `destination`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerLink {
    /// The device whose kernels and copies access the other's memory.
    pub source: i32,
    /// The device whose memory is accessed.
    pub destination: i32,
    /// Whether peer access is possible (`cuCtxEnablePeerAccess` will succeed).
    pub access: bool,
    /// Whether atomics on the peer's memory are native (true over NVLink, false over PCIe).
    pub native_atomics: bool,
    /// The driver's relative performance rank of the link: 0 is the fastest; only meaningful
    /// between pairs of one machine.
    pub performance_rank: i32,
}

/// What kind of link joins two devices, as far as the driver API tells.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkKind {
    /// Peer access with native atomics: an NVLink (or NVSwitch) connection.
    NvLink,
    /// Peer access without native atomics: PCIe peer-to-peer.
    Pcie,
    /// No peer access: copies go through host memory.
    None,
}

impl LinkKind {
    /// A short name (`nvlink`, `pcie`, `none`).
    pub fn name(self) -> &'static str {
        match self {
            LinkKind::NvLink => "nvlink",
            LinkKind::Pcie => "pcie",
            LinkKind::None => "none",
        }
    }
}

impl PeerLink {
    /// The link's kind. The driver API names no link type; native peer atomics are what tells
    /// NVLink from PCIe (PCIe peer-to-peer has none), so that is what this reads.
    pub fn kind(&self) -> LinkKind {
        match (self.access, self.native_atomics) {
            (false, _) => LinkKind::None,
            (true, true) => LinkKind::NvLink,
            (true, false) => LinkKind::Pcie,
        }
    }
}

/// Reads the link from device `source` to device `destination` (distinct ordinals).
pub fn peer_link(api: &DriverApi, source: i32, destination: i32) -> Result<PeerLink, Error> {
    let handle = |ordinal| -> Result<CUdevice, Error> {
        let mut device: CUdevice = 0;
        // SAFETY: `device` is a valid out-pointer.
        unsafe { crate::cu!(api, cuDeviceGet(&mut device, ordinal)) }?;
        Ok(device)
    };
    let (from, to) = (handle(source)?, handle(destination)?);
    let attribute = |attribute| -> Result<i32, Error> {
        let mut value: c_int = 0;
        // SAFETY: `value` is a valid out-pointer; both devices are valid handles.
        unsafe {
            crate::cu!(
                api,
                cuDeviceGetP2PAttribute(&mut value, attribute, from, to)
            )
        }?;
        Ok(value)
    };
    Ok(PeerLink {
        source,
        destination,
        access: attribute(CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED)? != 0,
        native_atomics: attribute(CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED)? != 0,
        performance_rank: attribute(CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK)?,
    })
}

/// Every ordered pair of distinct devices and its link: the machine's topology.
pub fn topology(api: &DriverApi) -> Result<Vec<PeerLink>, Error> {
    let count = device_count(api)?;
    let mut links = Vec::new();
    for source in 0..count {
        for destination in (0..count).filter(|d| *d != source) {
            links.push(peer_link(api, source, destination)?);
        }
    }
    Ok(links)
}

/// Text from a driver-filled buffer, up to its first NUL (or the whole buffer if none).
fn c_text(buffer: &[c_char]) -> String {
    // SAFETY: c_char and u8 have the same size and alignment; the slice stays borrowed.
    let bytes = unsafe { std::slice::from_raw_parts(buffer.as_ptr().cast::<u8>(), buffer.len()) };
    match CStr::from_bytes_until_nul(bytes) {
        Ok(text) => text.to_string_lossy().into_owned(),
        Err(_) => String::from_utf8_lossy(bytes).into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_prints_like_nvidia_smi() {
        let info = DeviceInfo {
            ordinal: 0,
            name: "x".into(),
            compute_capability: (9, 0),
            total_memory: 0,
            uuid: CUuuid {
                bytes: [
                    0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 0x01, 0x23, 0x45, 0x67, 0x89,
                    0xab, 0xcd, 0xef,
                ],
            },
            pci_bus_id: String::new(),
            multiprocessors: 1,
        };
        assert_eq!(
            info.uuid_string(),
            "GPU-12345678-9abc-def0-0123-456789abcdef"
        );
    }

    #[test]
    fn c_text_stops_at_nul_and_survives_none() {
        let mut buf = [0 as c_char; 8];
        for (i, b) in b"H200".iter().enumerate() {
            buf[i] = *b as c_char;
        }
        assert_eq!(c_text(&buf), "H200");
        let full = [b'a' as c_char; 4];
        assert_eq!(c_text(&full), "aaaa");
    }
}
