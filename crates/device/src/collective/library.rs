//! The NCCL library ([`Nccl`]) and the unique id that names a communicator across processes.

use std::path::PathBuf;
use std::sync::Arc;

use cuhal_sys::{NcclApi, NcclUniqueId, nccl};

use crate::error::Result;

/// The NCCL library, loaded at run time.
#[derive(Clone, Debug)]
pub struct Nccl {
    pub(super) api: Arc<NcclApi>,
}

impl Nccl {
    /// Loads NCCL from `path`, else from `CUHAL_NCCL_LIBRARY`, else `libnccl.so.2` through the
    /// loader's path, and checks its version. Without NCCL this is a typed error
    /// ([`Error::Nccl`](crate::Error::Nccl)); nothing else of cuhal needs it.
    pub fn load(path: Option<PathBuf>) -> Result<Self> {
        Ok(Self {
            api: Arc::new(NcclApi::load(path)?),
        })
    }

    /// The version (`ncclGetVersion`'s encoding: 22805 for 2.28.5).
    pub fn version(&self) -> i32 {
        self.api.version()
    }

    /// The library loaded.
    pub fn library_path(&self) -> &str {
        self.api.library_path()
    }

    /// A new unique id (`ncclGetUniqueId`): made by one process, passed by the caller to every
    /// process that joins the communicator ([`UniqueId::to_bytes`]).
    pub fn unique_id(&self) -> Result<UniqueId> {
        let mut id = NcclUniqueId { internal: [0; 128] };
        // SAFETY: `id` is a valid out-pointer.
        unsafe { nccl!(self.api, ncclGetUniqueId(&mut id)) }?;
        Ok(UniqueId(id))
    }
}

/// A communicator's unique id, as bytes to pass between processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UniqueId(pub(super) NcclUniqueId);

impl UniqueId {
    /// The id's 128 bytes.
    pub fn to_bytes(&self) -> [u8; 128] {
        self.0.internal
    }

    /// The id from bytes another process sent.
    pub fn from_bytes(bytes: [u8; 128]) -> Self {
        UniqueId(NcclUniqueId { internal: bytes })
    }
}
