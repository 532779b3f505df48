//! Kernels for the Hopper launch tests (`tests/hopper.rs`): thread-block clusters, cooperative
//! grid synchronization, programmatic dependent launch and indirect dispatch. Hand-written PTX
//! for `sm_90` (PTX ISA 7.8: clusters and `griddepcontrol`).
//!
//! - `cluster_swap(u32 *out)`, compiled for clusters of 2 blocks (`.reqnctapercluster 2, 1, 1`),
//!   and `cluster_swap_any(u32 *out)`, the same without a compiled-in cluster (launch it with
//!   one): each block stores `rank * 1000 + blockIdx.x` in its shared memory, the cluster
//!   synchronizes, and thread 0 reads its partner's word (rank ^ 1) through distributed shared
//!   memory (`mapa` + `ld.shared::cluster`) and writes `out[2b] = partner's word`,
//!   `out[2b + 1] = %cluster_ctarank`.
//! - `grid_sum(u32 *slots, u32 *counter, u32 *out)`: block b stores `3b + 1` in `slots[b]`, then
//!   waits at a grid-wide barrier (an atomic counter; it only finishes when every block is
//!   resident at once, which a cooperative launch guarantees) and writes the sum of all slots to
//!   `out[b]`. A barrier that does not complete within ~10^8 polls writes `0xffffffff` instead of
//!   hanging. `*counter` must be 0 before the launch.
//! - `pdl_step(u32 *data, u32 n)`: triggers its dependents at once, waits for its prerequisite
//!   grid (`griddepcontrol.wait`), then adds 1 to `data[i]` for `i < n`.
//! - `gate_counts(u32 *flag, u32 *counts, u32 x, u32 y, u32 z)`: one thread polls the
//!   host-mapped `*flag` until it is non-zero (at most ~10^8 polls; then it writes counts 0, 0,
//!   0), then writes the counts `x, y, z`.
//! - `count_blocks(u32 *hits)`: every thread adds 1 to `hits[0]`; thread 0 of block (0, 0, 0)
//!   writes `gridDim` to `hits[1..4]`.

/// The module; see the module documentation for each kernel.
pub const HOPPER_KERNELS: &str = r#"
.version 7.8
.target sm_90
.address_size 64

.visible .entry cluster_swap(
    .param .u64 cs_out
)
.reqnctapercluster 2, 1, 1
{
    .reg .pred  %p<2>;
    .reg .b32   %r<10>;
    .reg .b64   %rd<5>;
    .shared .align 4 .b32 cs_word;

    ld.param.u64        %rd1, [cs_out];
    mov.u32             %r1, %ctaid.x;
    mov.u32             %r2, %cluster_ctarank;
    mov.u32             %r3, %tid.x;
    setp.ne.u32         %p1, %r3, 0;
    mad.lo.u32          %r4, %r2, 1000, %r1;
    @!%p1 st.shared.u32 [cs_word], %r4;
    barrier.cluster.arrive;
    barrier.cluster.wait;
    @%p1 bra            CS_DONE;
    xor.b32             %r5, %r2, 1;
    mov.u32             %r6, cs_word;
    mapa.shared::cluster.u32 %r7, %r6, %r5;
    ld.shared::cluster.u32 %r8, [%r7];
    cvta.to.global.u64  %rd2, %rd1;
    mul.wide.u32        %rd3, %r1, 8;
    add.s64             %rd4, %rd2, %rd3;
    st.global.u32       [%rd4], %r8;
    st.global.u32       [%rd4+4], %r2;
CS_DONE:
    barrier.cluster.arrive;
    barrier.cluster.wait;
    ret;
}

.visible .entry cluster_swap_any(
    .param .u64 csa_out
)
{
    .reg .pred  %p<2>;
    .reg .b32   %r<10>;
    .reg .b64   %rd<5>;
    .shared .align 4 .b32 csa_word;

    ld.param.u64        %rd1, [csa_out];
    mov.u32             %r1, %ctaid.x;
    mov.u32             %r2, %cluster_ctarank;
    mov.u32             %r3, %tid.x;
    setp.ne.u32         %p1, %r3, 0;
    mad.lo.u32          %r4, %r2, 1000, %r1;
    @!%p1 st.shared.u32 [csa_word], %r4;
    barrier.cluster.arrive;
    barrier.cluster.wait;
    @%p1 bra            CSA_DONE;
    xor.b32             %r5, %r2, 1;
    mov.u32             %r6, csa_word;
    mapa.shared::cluster.u32 %r7, %r6, %r5;
    ld.shared::cluster.u32 %r8, [%r7];
    cvta.to.global.u64  %rd2, %rd1;
    mul.wide.u32        %rd3, %r1, 8;
    add.s64             %rd4, %rd2, %rd3;
    st.global.u32       [%rd4], %r8;
    st.global.u32       [%rd4+4], %r2;
CSA_DONE:
    barrier.cluster.arrive;
    barrier.cluster.wait;
    ret;
}

.visible .entry grid_sum(
    .param .u64 gs_slots,
    .param .u64 gs_counter,
    .param .u64 gs_out
)
{
    .reg .pred  %p<4>;
    .reg .b32   %r<12>;
    .reg .b64   %rd<10>;

    mov.u32             %r1, %tid.x;
    setp.ne.u32         %p1, %r1, 0;
    @%p1 bra            GS_DONE;
    ld.param.u64        %rd1, [gs_slots];
    ld.param.u64        %rd2, [gs_counter];
    ld.param.u64        %rd3, [gs_out];
    cvta.to.global.u64  %rd1, %rd1;
    cvta.to.global.u64  %rd2, %rd2;
    cvta.to.global.u64  %rd3, %rd3;
    mov.u32             %r2, %ctaid.x;
    mov.u32             %r3, %nctaid.x;
    mad.lo.u32          %r4, %r2, 3, 1;
    mul.wide.u32        %rd4, %r2, 4;
    add.s64             %rd5, %rd1, %rd4;
    st.global.u32       [%rd5], %r4;
    atom.release.gpu.global.add.u32 %r5, [%rd2], 1;
    mov.u32             %r6, 0;
GS_SPIN:
    ld.acquire.gpu.global.u32 %r7, [%rd2];
    setp.ge.u32         %p2, %r7, %r3;
    @%p2 bra            GS_SUM;
    add.u32             %r6, %r6, 1;
    setp.lt.u32         %p3, %r6, 100000000;
    @%p3 bra            GS_SPIN;
    mov.u32             %r8, -1;
    bra.uni             GS_WRITE;
GS_SUM:
    mov.u32             %r8, 0;
    mov.u32             %r9, 0;
GS_LOOP:
    mul.wide.u32        %rd6, %r9, 4;
    add.s64             %rd7, %rd1, %rd6;
    ld.relaxed.gpu.global.u32 %r10, [%rd7];
    add.u32             %r8, %r8, %r10;
    add.u32             %r9, %r9, 1;
    setp.lt.u32         %p2, %r9, %r3;
    @%p2 bra            GS_LOOP;
GS_WRITE:
    add.s64             %rd8, %rd3, %rd4;
    st.global.u32       [%rd8], %r8;
GS_DONE:
    ret;
}

.visible .entry pdl_step(
    .param .u64 pdl_data,
    .param .u32 pdl_n
)
{
    .reg .pred  %p<2>;
    .reg .b32   %r<8>;
    .reg .b64   %rd<5>;

    griddepcontrol.launch_dependents;
    griddepcontrol.wait;
    ld.param.u64        %rd1, [pdl_data];
    ld.param.u32        %r1, [pdl_n];
    mov.u32             %r2, %ctaid.x;
    mov.u32             %r3, %ntid.x;
    mov.u32             %r4, %tid.x;
    mad.lo.u32          %r5, %r2, %r3, %r4;
    setp.ge.u32         %p1, %r5, %r1;
    @%p1 bra            PDL_DONE;
    cvta.to.global.u64  %rd2, %rd1;
    mul.wide.u32        %rd3, %r5, 4;
    add.s64             %rd4, %rd2, %rd3;
    ld.global.u32       %r6, [%rd4];
    add.u32             %r7, %r6, 1;
    st.global.u32       [%rd4], %r7;
PDL_DONE:
    ret;
}

.visible .entry gate_counts(
    .param .u64 gc_flag,
    .param .u64 gc_counts,
    .param .u32 gc_x,
    .param .u32 gc_y,
    .param .u32 gc_z
)
{
    .reg .pred  %p<3>;
    .reg .b32   %r<8>;
    .reg .b64   %rd<3>;

    ld.param.u64        %rd1, [gc_flag];
    ld.param.u64        %rd2, [gc_counts];
    ld.param.u32        %r1, [gc_x];
    ld.param.u32        %r2, [gc_y];
    ld.param.u32        %r3, [gc_z];
    mov.u32             %r4, 0;
GC_SPIN:
    ld.volatile.u32     %r5, [%rd1];
    setp.ne.u32         %p1, %r5, 0;
    @%p1 bra            GC_WRITE;
    add.u32             %r4, %r4, 1;
    setp.lt.u32         %p2, %r4, 100000000;
    @%p2 bra            GC_SPIN;
    mov.u32             %r1, 0;
    mov.u32             %r2, 0;
    mov.u32             %r3, 0;
GC_WRITE:
    cvta.to.global.u64  %rd2, %rd2;
    st.global.u32       [%rd2], %r1;
    st.global.u32       [%rd2+4], %r2;
    st.global.u32       [%rd2+8], %r3;
    ret;
}

.visible .entry count_blocks(
    .param .u64 cb_hits
)
{
    .reg .pred  %p<2>;
    .reg .b32   %r<10>;
    .reg .b64   %rd<3>;

    ld.param.u64        %rd1, [cb_hits];
    cvta.to.global.u64  %rd2, %rd1;
    atom.global.add.u32 %r1, [%rd2], 1;
    mov.u32             %r2, %tid.x;
    mov.u32             %r3, %ctaid.x;
    mov.u32             %r4, %ctaid.y;
    mov.u32             %r5, %ctaid.z;
    or.b32              %r6, %r2, %r3;
    or.b32              %r6, %r6, %r4;
    or.b32              %r6, %r6, %r5;
    setp.ne.u32         %p1, %r6, 0;
    @%p1 bra            CB_DONE;
    mov.u32             %r7, %nctaid.x;
    mov.u32             %r8, %nctaid.y;
    mov.u32             %r9, %nctaid.z;
    st.global.u32       [%rd2+4], %r7;
    st.global.u32       [%rd2+8], %r8;
    st.global.u32       [%rd2+12], %r9;
CB_DONE:
    ret;
}
"#;
