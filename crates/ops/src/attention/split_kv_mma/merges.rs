//! The decode kernel's merges: its planes' softmax states within a cube, and, with
//! [`SplitKvMmaBlueprint::merge`], its cubes' partials within the launch.

use cubecl::prelude::*;

use super::SplitKvMmaBlueprint;
use crate::attention::cluster_merge::{exchange_ready, send_element, send_stats};
use crate::attention::flash_step::exp2_approx;
use crate::attention::geometry::{partial_rows, Geometry, SplitBuffers};
use crate::attention::merge::{merge_row, MergeBlueprint};
use crate::gemm::split_k::fence_device;
use crate::online_softmax::EMPTY_MAX;

/// Elements of the kernel's 16-bit dtype in one 32-bit word of the planes' merge buffers, which
/// live in the K/V stages' memory.
pub(super) const WORD_ELEMS: usize = 2;

/// One f32 of the planes' merge buffers, stored in the K/V stages' memory as the bits of two
/// elements of the dtype.
pub(super) type Word<F> = Vector<F, Const<WORD_ELEMS>>;

/// Combines the planes' `(max, sum, acc)` (each f32 stored as one `W`: an f32, or a [`Word`] of
/// the K/V stages) of the block's `rows_here` rows into the cube's output (or partials, or with
/// [`SplitKvMmaBlueprint::exchange`] the partials sent to the cubes of the cluster that own
/// them): one unit per row first finds the row's maximum, each plane's weight
/// `2^(max_w c - max c)`, the weighted sum and the row's output row (kept in `orow_sh` for the
/// cluster's merge), then every unit combines output elements with those weights, so that no
/// element recomputes the row's statistics.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn merge_planes<F: Float, W: CubePrimitive>(
    io: &mut SplitBuffers<F, f32>,
    o_sh: &[W],
    st_sh: &[W],
    orow_sh: &mut [u32],
    geo: &Geometry,
    first_rho: u32,
    rows_here: u32,
    c: f32,
    recv: u32,
    bar: u32,
    #[comptime] blueprint: SplitKvMmaBlueprint,
) {
    let d = comptime![blueprint.d];
    let units = comptime![32 * blueprint.warps];
    if comptime![blueprint.exchange] {
        exchange_ready();
    }
    let warps = comptime![blueprint.warps];
    let empty = f32::new(EMPTY_MAX);
    let b = CUBE_POS_Z / geo.row_blocks;
    let rows_out = partial_rows(geo);
    let split_rows = CUBE_POS_X as usize * rows_out;
    let mut w_sh = Shared::<[f32]>::new_slice(comptime![warps * 16]);
    let mut inv_sh = Shared::<[f32]>::new_slice(16usize);
    if UNIT_POS < rows_here {
        let r = UNIT_POS as usize;
        let rho = first_rho + UNIT_POS;
        let mut mm = empty;
        #[unroll]
        for w in 0..warps {
            mm = max(mm, f32::reinterpret(st_sh[(w * 16 + r) * 2]));
        }
        let mc = select(mm == empty, 0f32, mm * c);
        let mut ll = 0f32;
        #[unroll]
        for w in 0..warps {
            let f = exp2_approx(f32::reinterpret(st_sh[(w * 16 + r) * 2]) * c - mc);
            w_sh[r * warps + w] = f;
            ll += f32::reinterpret(st_sh[(w * 16 + r) * 2 + 1]) * f;
        }
        let orow =
            (b * geo.lq + rho / geo.group) * geo.hq + CUBE_POS_Y * geo.group + rho % geo.group;
        orow_sh[r] = orow;
        // The merge works in natural units of the scaled scores.
        let m_nat = select(
            mm == empty,
            empty,
            mm * c * f32::new(core::f32::consts::LN_2),
        );
        if comptime![blueprint.exchange] {
            send_stats(recv, bar, UNIT_POS, m_nat, ll, d, units);
        } else if comptime![blueprint.partial] {
            let prow = split_rows + orow as usize;
            io.part_stats[prow * 2] = m_nat;
            io.part_stats[prow * 2 + 1] = ll;
        } else {
            inv_sh[r] = select(ll > 0f32, 1f32 / ll, 0f32);
        }
    }
    sync_cube();

    for e in range_stepped(UNIT_POS as usize, rows_here as usize * d, CUBE_DIM as usize) {
        let r = e / d;
        let dd = e % d;
        let mut acc = 0f32;
        #[unroll]
        for w in 0..warps {
            acc += f32::reinterpret(o_sh[(w * 16 + r) * d + dd]) * w_sh[r * warps + w];
        }
        let orow = orow_sh[r] as usize;
        if comptime![blueprint.exchange] {
            send_element(recv, bar, e as u32, acc, d, units);
        } else if comptime![blueprint.partial] {
            io.part_acc[(split_rows + orow) * d + dd] = acc;
        } else {
            io.out[orow * d + dd] = F::cast_from(acc * inv_sh[r]);
        }
    }
}

/// The merge of a plain split launch inside it: each cube counts itself done on its (sequence,
/// KV head, row block)'s counter (after a device-scope fence of its partials), the one that
/// completes the count resets it to zero for the next launch, and the cubes of the first
/// `rows_here` splits, having waited for that reset, merge one row of the block each (row
/// `split`, `split + splits`, ...; [`merge_row`], the merge kernel's arithmetic). Only those
/// few cubes wait, and only for cubes of their own launch; the rest leave at once, and no merge
/// kernel is launched and waited for after this one.
///
/// The waiting cubes need the rest of the launch to run beside them: the launch is set up so
/// only where all its cubes fit on the GPU at once. (Many such launches on concurrent streams
/// could in principle fill every SM with waiting cubes while each has cubes still to start. In
/// practice the GPU starts the cubes of the launch queued first before those of later ones,
/// which keeps the oldest launch moving, but CUDA does not promise that order.)
#[cube]
pub(super) fn merge_own_partials<F: Float>(
    io: &mut SplitBuffers<F, f32>,
    geo: &Geometry,
    counters: &[Atomic<u32>],
    orow_sh: &[u32],
    rows_here: u32,
    #[comptime] merge: MergeBlueprint,
) {
    let slot = (CUBE_POS_Z * geo.hkv + CUBE_POS_Y) as usize;
    let merger = CUBE_POS_X < rows_here;
    fence_device();
    sync_cube();
    if UNIT_POS == 0 {
        let done = counters[slot].fetch_add(1u32) + 1u32;
        if done == geo.splits {
            counters[slot].store(0u32);
        } else if merger {
            loop {
                if counters[slot].load() == 0u32 {
                    break;
                }
            }
        }
    }
    sync_cube();
    if merger {
        fence_device();
        let rows_out = partial_rows(geo) as u32;
        for r in range_stepped(CUBE_POS_X, rows_here, geo.splits) {
            merge_row::<F>(
                &io.part_acc,
                &io.part_stats,
                &mut io.out,
                orow_sh[r as usize] as usize,
                true,
                geo.splits,
                rows_out,
                merge,
            );
        }
    }
}
