//! The fake NCCL, called directly (no cuhal check in between): the ranks of a round must agree
//! on each collective's call, count, data type, reduction and root, or the round fails for
//! every rank with `ncclInvalidUsage`, computes nothing, and says why in `ncclGetLastError`.
//! Later rounds run as usual.

use std::ffi::{CStr, c_void};
use std::ptr::{null, null_mut};
use std::sync::Arc;

use cuhal_fake_driver::harness::FakeDriver;
use cuhal_sys::*;

/// `ncclInvalidUsage`.
const INVALID_USAGE: NcclResult = 5;

/// Two fake devices, a stream and four f32s on each, and a communicator of two ranks over them
/// (`ncclCommInitAll`).
struct Ranks {
    _fake: FakeDriver,
    nccl: NcclApi,
    contexts: [Arc<PrimaryContext>; 2],
    streams: [Stream; 2],
    buffers: [CUdeviceptr; 2],
    comms: [NcclComm; 2],
}

impl Ranks {
    fn new(tag: &str) -> Ranks {
        let fake = FakeDriver::private(tag).unwrap();
        fake.set_device_count(2);
        let api = Arc::new(DriverApi::load_from(fake.path()).unwrap());
        let contexts = [0, 1].map(|d| PrimaryContext::retain(api.clone(), d).unwrap());
        let streams = [0, 1].map(|d| Stream::new(&contexts[d], CU_STREAM_NON_BLOCKING).unwrap());
        let buffers = [0, 1].map(|d| {
            let _bound = contexts[d].enter().unwrap();
            let mut ptr = 0;
            // SAFETY: a valid out-pointer; the device's context is current.
            let r = unsafe { (api.cuMemAlloc)(&mut ptr, 16) };
            assert_eq!(r, CUresult::SUCCESS);
            ptr
        });
        let nccl = NcclApi::load(Some(fake.path().to_path_buf())).unwrap();
        let mut comms = [null_mut(); 2];
        // SAFETY: `comms` has room for two handles; a null device list means devices 0 and 1.
        let r = unsafe { (nccl.ncclCommInitAll)(comms.as_mut_ptr(), 2, null()) };
        assert_eq!(r, NCCL_SUCCESS);
        let ranks = Ranks {
            _fake: fake,
            nccl,
            contexts,
            streams,
            buffers,
            comms,
        };
        ranks.write(0, [1.0, 2.0, 3.0, 4.0]);
        ranks.write(1, [10.0, 20.0, 30.0, 40.0]);
        ranks
    }

    fn api(&self) -> &DriverApi {
        self.contexts[0].api()
    }

    fn write(&self, rank: usize, values: [f32; 4]) {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        // SAFETY: the buffer holds 16 bytes, as many as `bytes`.
        let r = unsafe { (self.api().cuMemcpyHtoD)(self.buffers[rank], bytes.as_ptr().cast(), 16) };
        assert_eq!(r, CUresult::SUCCESS);
    }

    fn read(&self, rank: usize) -> Vec<f32> {
        let mut bytes = [0u8; 16];
        // SAFETY: both hold 16 bytes.
        let r =
            unsafe { (self.api().cuMemcpyDtoH)(bytes.as_mut_ptr().cast(), self.buffers[rank], 16) };
        assert_eq!(r, CUresult::SUCCESS);
        bytes
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    /// One group of both ranks' calls, `call(rank, buffer, comm, stream)` each (calls inside a
    /// group only collect; the group's end runs the round and returns its result).
    fn round(
        &self,
        call: impl Fn(usize, *mut c_void, NcclComm, CUstream) -> NcclResult,
    ) -> NcclResult {
        // SAFETY: no arguments; the group is ended below.
        assert_eq!(unsafe { (self.nccl.ncclGroupStart)() }, NCCL_SUCCESS);
        for rank in 0..2 {
            let buffer = self.buffers[rank] as usize as *mut c_void;
            let called = call(rank, buffer, self.comms[rank], self.streams[rank].raw());
            assert_eq!(called, NCCL_SUCCESS, "rank {rank}'s call inside the group");
        }
        // SAFETY: ends the group started above.
        unsafe { (self.nccl.ncclGroupEnd)() }
    }

    /// `round(call)` fails with `ncclInvalidUsage`, leaves both buffers as they were, and
    /// leaves a message naming the disagreement on both communicators, which this returns.
    fn refused(
        &self,
        call: impl Fn(usize, *mut c_void, NcclComm, CUstream) -> NcclResult,
    ) -> String {
        let before = [self.read(0), self.read(1)];
        assert_eq!(self.round(call), INVALID_USAGE);
        assert_eq!([self.read(0), self.read(1)], before, "nothing was computed");
        let [first, second] = self.comms.map(|comm| {
            // SAFETY: the communicator is live; the fake keeps the message until its next error.
            unsafe { CStr::from_ptr((self.nccl.ncclGetLastError)(comm)) }
                .to_string_lossy()
                .into_owned()
        });
        assert_eq!(first, second, "both ranks say why");
        first
    }

    /// A sum of both buffers in place, which must now succeed.
    fn all_reduce_sum(&self) {
        let r = self.round(|_, buffer, comm, stream| {
            // SAFETY: 16 bytes of the communicator's device; the stream is of that device.
            unsafe {
                (self.nccl.ncclAllReduce)(
                    buffer,
                    buffer,
                    4,
                    NcclDataType::F32,
                    NcclRedOp::Sum,
                    comm,
                    stream,
                )
            }
        });
        assert_eq!(r, NCCL_SUCCESS);
    }
}

impl Drop for Ranks {
    fn drop(&mut self) {
        for comm in self.comms {
            // SAFETY: the communicator is live and idle (the fake's work is synchronous).
            unsafe { (self.nccl.ncclCommDestroy)(comm) };
        }
    }
}

#[test]
fn an_all_reduce_of_f32_against_i32_fails_without_computing() {
    let ranks = Ranks::new("nccl-agree-dtype");
    let message = ranks.refused(|rank, buffer, comm, stream| {
        let t = [NcclDataType::F32, NcclDataType::I32][rank];
        // SAFETY: as in `all_reduce_sum`.
        unsafe { (ranks.nccl.ncclAllReduce)(buffer, buffer, 4, t, NcclRedOp::Sum, comm, stream) }
    });
    assert!(
        message.contains("datatype: 2") && message.contains("datatype: 7"),
        "{message}"
    );
    ranks.all_reduce_sum();
    assert_eq!(ranks.read(0), [11.0, 22.0, 33.0, 44.0]);
    assert_eq!(ranks.read(1), [11.0, 22.0, 33.0, 44.0]);
}

#[test]
fn reductions_counts_roots_and_calls_that_differ_fail_without_computing() {
    let ranks = Ranks::new("nccl-agree-fields");
    let nccl = &ranks.nccl;
    let f = NcclDataType::F32;
    // Sum against max.
    let message = ranks.refused(|rank, buffer, comm, stream| {
        let op = [NcclRedOp::Sum, NcclRedOp::Max][rank];
        // SAFETY: as in `all_reduce_sum`.
        unsafe { (nccl.ncclAllReduce)(buffer, buffer, 4, f, op, comm, stream) }
    });
    assert!(
        message.contains("op: Some(2)") && message.contains("op: Some(0)"),
        "{message}"
    );
    // Four elements against two.
    let message = ranks.refused(|rank, buffer, comm, stream| {
        let count = [4, 2][rank];
        // SAFETY: as in `all_reduce_sum` (two elements fit as well).
        unsafe { (nccl.ncclAllReduce)(buffer, buffer, count, f, NcclRedOp::Sum, comm, stream) }
    });
    assert!(
        message.contains("count: 2") && message.contains("count: 4"),
        "{message}"
    );
    // Broadcast from root 0 against root 1.
    let message = ranks.refused(|rank, buffer, comm, stream| {
        // SAFETY: as in `all_reduce_sum`.
        unsafe { (nccl.ncclBroadcast)(buffer, buffer, 4, f, rank as i32, comm, stream) }
    });
    assert!(
        message.contains("root: Some(1)") && message.contains("root: Some(0)"),
        "{message}"
    );
    // An all-reduce against a broadcast.
    let message = ranks.refused(|rank, buffer, comm, stream| {
        // SAFETY: as in `all_reduce_sum`.
        unsafe {
            if rank == 0 {
                (nccl.ncclAllReduce)(buffer, buffer, 4, f, NcclRedOp::Sum, comm, stream)
            } else {
                (nccl.ncclBroadcast)(buffer, buffer, 4, f, 0, comm, stream)
            }
        }
    });
    assert!(
        message.contains("ncclBroadcast") && message.contains("ncclAllReduce"),
        "{message}"
    );
    // The communicators go on.
    ranks.all_reduce_sum();
    assert_eq!(ranks.read(0), [11.0, 22.0, 33.0, 44.0]);
}
