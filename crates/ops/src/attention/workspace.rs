//! The key split of the split launches and where their f32 partials `(acc, max, sum)` live.

use cubecl::prelude::*;

use super::geometry::{GeometryLaunch, SplitBuffersLaunch};
use super::merge;
use super::plan::Problem;
use crate::{caps, DType, DeviceTensor, OpsError, Result};

/// Preallocated room for the split partials of [`super::attention_cached_into`], so that a decode
/// step allocates nothing (a requirement of CUDA graph capture).
pub struct AttentionWorkspace<R: Runtime> {
    acc: DeviceTensor<R>,
    stats: DeviceTensor<R>,
    /// One u32 a (sequence, KV head, row block) for the kernels that merge their own partials
    /// after counting their cubes done (zero between launches).
    counters: DeviceTensor<R>,
    rows: usize,
    d: usize,
}

impl<R: Runtime> AttentionWorkspace<R> {
    /// Room for `rows` partial output rows (splits x query rows x query heads) of head dim `d`.
    pub fn new(client: &ComputeClient<R>, rows: usize, d: usize) -> Self {
        let rows = rows.max(1);
        Self {
            acc: DeviceTensor::empty(client, &[rows * d.max(1)], DType::F32),
            stats: DeviceTensor::empty(client, &[rows * 2], DType::F32),
            counters: DeviceTensor::from_handle(
                client.create_from_slice(&vec![0u8; 4 * rows]),
                &[rows],
                DType::U32,
            ),
            rows,
            d,
        }
    }

    /// A workspace large enough for every call with up to `q_len` query tokens of `q_heads`
    /// heads and head dim `head_dim` over at most `max_len` keys, whatever kernel
    /// [`super::AttentionStrategy::Auto`] runs (and a forced one with at most 2 cubes per SM).
    pub fn for_shapes(
        client: &ComputeClient<R>,
        q_len: usize,
        q_heads: usize,
        _kv_heads: usize,
        head_dim: usize,
        max_len: usize,
    ) -> Self {
        // Every kernel asks `split_plan` for at most 2 cubes per SM, and a split holds at least
        // one step of 8 keys; a clustered launch always has `CLUSTER_SPLITS`.
        let splits = (2 * caps::num_sms(client) as usize)
            .min(max_len.div_ceil(8))
            .max(CLUSTER_SPLITS);
        Self::new(client, splits * q_len.max(1) * q_heads.max(1), head_dim)
    }
}

/// Splits of a clustered launch (one thread-block cluster of cubes along the keys, which merge
/// their partials themselves): the cluster size every CUDA GPU with clusters supports.
pub(crate) const CLUSTER_SPLITS: usize = 8;

/// Whether `max_len` keys fit a clustered launch: [`CLUSTER_SPLITS`] splits of one `step`-key
/// tile each.
pub(crate) fn keys_fit_cluster(max_len: usize, step: usize) -> bool {
    max_len <= CLUSTER_SPLITS * step
}

/// How many cubes share the keys of one (sequence, row block, KV head): enough cubes to cover the
/// device (`target`), never a chunk shorter than one step of the kernel.
fn split_plan(max_len: usize, step: usize, cubes: usize, target: usize) -> (usize, usize) {
    let want = target.div_ceil(cubes.max(1)).max(1);
    let most = max_len.div_ceil(step).max(1);
    let s = want.min(most);
    let chunk = max_len.div_ceil(s).div_ceil(step) * step;
    (max_len.div_ceil(chunk).max(1), chunk)
}

/// The f32 partials of a split launch (a workspace's buffers, or buffers allocated for this call;
/// with one split they are bound but never touched).
pub(crate) enum Partials<'a, R: Runtime> {
    Owned {
        acc: DeviceTensor<R>,
        stats: DeviceTensor<R>,
    },
    Borrowed(&'a AttentionWorkspace<R>),
}

impl<'a, R: Runtime> Partials<'a, R> {
    fn new(
        client: &ComputeClient<R>,
        op: &'static str,
        p: &Problem<'a, R>,
        splits: usize,
    ) -> Result<Self> {
        let rows = splits * p.rows_out();
        if let Some(ws) = p.workspace {
            if splits > 1 && (ws.rows < rows || ws.d != p.d) {
                return Err(OpsError::invalid(
                    op,
                    format!(
                        "workspace for {} rows of dim {} is too small ({rows} rows of dim {} needed)",
                        ws.rows, ws.d, p.d
                    ),
                ));
            }
            return Ok(Partials::Borrowed(ws));
        }
        let (acc, stats) = if splits > 1 {
            (rows * p.d, rows * 2)
        } else {
            (1, 1)
        };
        Ok(Partials::Owned {
            acc: DeviceTensor::empty(client, &[acc], DType::F32),
            stats: DeviceTensor::empty(client, &[stats], DType::F32),
        })
    }

    pub fn acc(&self) -> &DeviceTensor<R> {
        match self {
            Partials::Owned { acc, .. } => acc,
            Partials::Borrowed(ws) => &ws.acc,
        }
    }

    pub fn stats(&self) -> &DeviceTensor<R> {
        match self {
            Partials::Owned { stats, .. } => stats,
            Partials::Borrowed(ws) => &ws.stats,
        }
    }

    /// A workspace's zeroed counters, one for each of its partial rows (so at least one a
    /// (sequence, KV head, row block) of any launch it has room for).
    pub fn counters(&self) -> Option<&DeviceTensor<R>> {
        match self {
            Partials::Owned { .. } => None,
            Partials::Borrowed(ws) => Some(&ws.counters),
        }
    }
}

/// One launch of a split kernel: its grid along the rows and the keys, and its partials.
pub(crate) struct Split<'a, R: Runtime> {
    /// Cubes along the `Lq * group` rows of one (sequence, KV head).
    pub row_blocks: usize,
    /// Cubes along the keys.
    pub splits: usize,
    /// Keys per split.
    pub chunk: usize,
    /// The cubes of one (sequence, KV head, row block) form one thread-block cluster and merge
    /// their own partials.
    pub clustered: bool,
    pub parts: Partials<'a, R>,
}

impl<'a, R: Runtime> Split<'a, R> {
    /// The split of a kernel that takes `rows` rows per cube and `step` keys per iteration, aiming
    /// for `target` cubes over the whole problem. With `cluster` (the kernel has a clustered
    /// form), where the keys fit [`CLUSTER_SPLITS`] splits of one `step`-key tile each, they
    /// would be split anyway and the caller's workspace (if any) has room: [`CLUSTER_SPLITS`]
    /// such splits (the last ones empty where the keys are fewer), [`Split::clustered`] set.
    pub fn new(
        client: &ComputeClient<R>,
        op: &'static str,
        p: &Problem<'a, R>,
        rows: usize,
        step: usize,
        target: usize,
        cluster: bool,
    ) -> Result<Self> {
        let row_blocks = p.row_blocks(rows);
        let cubes = p.unsplit_cubes(rows);
        let max_len = p.max_len();
        let (splits, chunk) = split_plan(max_len, step, cubes, target);
        let room = p
            .workspace
            .is_none_or(|ws| ws.rows >= CLUSTER_SPLITS * p.rows_out() && ws.d == p.d);
        let clustered = cluster && room && splits > 1 && keys_fit_cluster(max_len, step);
        let (splits, chunk) = if clustered {
            (CLUSTER_SPLITS, step)
        } else {
            (splits, chunk)
        };
        Ok(Self {
            row_blocks,
            splits,
            chunk,
            clustered,
            parts: Partials::new(client, op, p, splits)?,
        })
    }

    /// Whether the kernel writes partials (more than one split) rather than the output.
    pub fn partial(&self) -> bool {
        self.splits > 1
    }

    /// The kernel's [`super::geometry::SplitBuffers`] argument (`E`, `P`: as the kernel reads
    /// them).
    ///
    /// # Safety
    /// The kernel reads and writes within the validated shapes of `p` and the partials this split
    /// was sized with.
    pub unsafe fn buffers<E: CubePrimitive, P: CubePrimitive>(
        &self,
        p: &Problem<'_, R>,
        len_t: &DeviceTensor<R>,
    ) -> SplitBuffersLaunch<E, P, R> {
        // SAFETY: the caller's contract.
        unsafe { self.buffers_reading(p.q, p, len_t) }
    }

    /// [`Self::buffers`] with the kernel's `q` bound to `q` instead of `p.q` (a RoPE launch reads
    /// the QKV row, whose first `Hq · D` elements are `p.q`).
    ///
    /// # Safety
    /// As [`Self::buffers`], for `q`'s elements.
    pub unsafe fn buffers_reading<E: CubePrimitive, P: CubePrimitive>(
        &self,
        q: &DeviceTensor<R>,
        p: &Problem<'_, R>,
        len_t: &DeviceTensor<R>,
    ) -> SplitBuffersLaunch<E, P, R> {
        // SAFETY: the caller's contract.
        unsafe {
            SplitBuffersLaunch::new(
                q.as_buffer_arg(),
                p.k.as_buffer_arg(),
                p.v.as_buffer_arg(),
                len_t.as_buffer_arg(),
                p.out.as_buffer_arg(),
                self.parts.acc().as_buffer_arg(),
                self.parts.stats().as_buffer_arg(),
            )
        }
    }

    /// The kernel's [`super::geometry::Geometry`] argument.
    pub fn geometry(&self, p: &Problem<'_, R>) -> GeometryLaunch<R> {
        GeometryLaunch::new(
            p.len_host(),
            p.lq as u32,
            p.hq as u32,
            p.hkv as u32,
            p.group() as u32,
            p.kv_rows as u32,
            self.chunk as u32,
            self.splits as u32,
            self.row_blocks as u32,
            p.scale,
            p.slots.is_some() as u32,
            p.slots.unwrap_or(1) as u32,
        )
    }

    /// Combines the partials into the output (nothing to do with one split).
    pub fn finish(&self, client: &ComputeClient<R>, p: &Problem<'_, R>) {
        if self.partial() {
            merge::launch(client, p, &self.parts, self.splits);
        }
    }
}
