//! K split across cubes for the decode products, with a deterministic reduction in the last cube
//! to finish (CUDA only: it needs a device-scope fence, which CubeCL does not emit, so it is
//! issued as inline PTX).
//!
//! Why: a decode product has one column group per 8 output columns (the `mma` tile), so a
//! 1536-column projection with a long K (the 1.5B model's `down`, K = 8960) has only 192 groups.
//! If each group is one cube that walks all of K, every plane's loop is a chain of dependent
//! memory latencies and the grid is 1.5 waves on 132 SMs. Splitting K across `S` cubes per group
//! gives each plane one batch of loads and the grid `192 · S` cubes; the `S` partial sums then
//! meet in [`SplitScratch`].
//!
//! The protocol (the classic "last block" reduction): each cube writes its partial sums to its
//! slot `group · S + s`, fences them at device scope, and one unit counts the split done with an
//! atomic add on the group's counter. The cube that brings the count to `S` resets the counter
//! to zero (so the next launch, or the next replay of a captured graph, finds it zeroed), fences
//! again, and sums the `S` slots **in slot order**: the result does not depend on which cube
//! finished last, so a product is bit-for-bit repeatable.

use cubecl::prelude::*;
use cubecl::server::Handle;

use crate::{DType, DeviceTensor};

/// A device-scope fence: this unit's memory operations before it are ordered before its
/// operations after it for every observer on the GPU (`__threadfence()`).
#[cube]
pub fn fence_device() {
    gpu_asm!("fence.acq_rel.gpu;");
}

/// Counts this cube's share of group `slot` as done; true, in every unit, in the cube that
/// finished last (which has reset the counter). Every unit of the cube must call it once, after
/// writing its partials; after it returns true the other cubes' partials are visible.
#[cube]
pub fn last_to_finish(counters: &[Atomic<u32>], slot: usize, #[comptime] splits: u32) -> bool {
    fence_device();
    sync_cube();
    let mut flag = Shared::<[u32]>::new_slice(1usize);
    if UNIT_POS == 0 {
        let done = counters[slot].fetch_add(1u32) + 1u32;
        let last = done == splits;
        if last {
            counters[slot].store(0u32);
        }
        flag[0] = select(last, 1u32, 0u32);
    }
    sync_cube();
    let last = flag[0] == 1u32;
    if last {
        fence_device();
    }
    last
}

/// Device memory for products that split K across cubes: f32 partial sums (one slot per cube)
/// and one u32 counter per column group, zero between launches. Owned by whoever runs the
/// products (the model's decode step keeps one in its
/// [`LinearWorkspace`](crate::linear::LinearWorkspace)), and used by one stream at a time: two
/// products running at once on the same scratch would mix their partials.
pub struct SplitScratch<R: Runtime> {
    partials: DeviceTensor<R>,
    counters: Handle,
    counter_len: usize,
}

impl<R: Runtime> Clone for SplitScratch<R> {
    fn clone(&self) -> Self {
        Self {
            partials: self.partials.clone(),
            counters: self.counters.clone(),
            counter_len: self.counter_len,
        }
    }
}

impl<R: Runtime> std::fmt::Debug for SplitScratch<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "SplitScratch {{ partials: {}, counters: {} }}",
            self.partial_len(),
            self.counter_len
        )
    }
}

impl<R: Runtime> SplitScratch<R> {
    /// Room for `partials` f32 sums and `counters` group counters (zeroed here; the kernels
    /// leave them zeroed).
    pub fn new(client: &ComputeClient<R>, need: SplitNeed) -> Self {
        let partial_len = need.partials.max(1);
        let counter_len = need.counters.max(1);
        Self {
            partials: DeviceTensor::empty(client, &[partial_len], DType::F32),
            counters: client.create_from_slice(&vec![0u8; 4 * counter_len]),
            counter_len,
        }
    }

    /// f32 sums it holds.
    pub fn partial_len(&self) -> usize {
        self.partials.numel()
    }

    /// Group counters it holds.
    pub fn counter_len(&self) -> usize {
        self.counter_len
    }

    /// Whether a launch needing `need` fits.
    pub fn fits(&self, need: SplitNeed) -> bool {
        need.partials <= self.partial_len() && need.counters <= self.counter_len
    }

    /// The partials as a kernel argument.
    ///
    /// # Safety
    /// The kernel must stay within [`Self::partial_len`].
    pub unsafe fn partials_arg(&self) -> BufferArg<R> {
        unsafe { self.partials.as_buffer_arg() }
    }

    /// The counters as a kernel argument.
    ///
    /// # Safety
    /// The kernel must stay within [`Self::counter_len`] and leave every counter at zero.
    pub unsafe fn counters_arg(&self) -> BufferArg<R> {
        unsafe { BufferArg::from_raw_parts(self.counters.clone(), self.counter_len) }
    }
}

/// What a launch that splits K across cubes needs of a [`SplitScratch`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SplitNeed {
    /// f32 partial sums.
    pub partials: usize,
    /// Group counters.
    pub counters: usize,
}

impl SplitNeed {
    /// The larger of two needs, field by field.
    pub fn max(self, other: Self) -> Self {
        Self {
            partials: self.partials.max(other.partials),
            counters: self.counters.max(other.counters),
        }
    }
}
