//! Token embedding: gather rows of a table by ids that live on the device.

use cubecl::prelude::*;

use crate::launch::{check_same_dtype, cube_count_1d};
use crate::{caps, DType, DeviceTensor, OpsError, Result};

#[cube(launch_unchecked)]
fn embedding_kernel<F: Float, I: Int, N: Size>(
    table: &[Vector<F, N>],
    ids: &[I],
    out: &mut [Vector<F, N>],
    tokens: usize,
    vocab: u32,
    row_vectors: usize,
    #[define(F, I)] _dtypes: [ElemType; 2],
) {
    let t = CUBE_POS;
    if t >= tokens {
        terminate!();
    }
    // Out-of-range ids (negative ones wrap to large u32) read the last row: a defined clamp,
    // since a host-side check would need to read the ids back.
    let id = min(u32::cast_from(ids[t]), vocab - 1) as usize;
    for i in range_stepped(UNIT_POS as usize, row_vectors, CUBE_DIM as usize) {
        out[t * row_vectors + i] = table[id * row_vectors + i];
    }
}

/// Checks a gather of `tokens` rows of `table` into `out`: `table` a non-empty `[V, H]` matrix,
/// `out` `[tokens, H]` of its dtype, both contiguous.
pub(crate) fn check_gather<R: Runtime>(
    op: &'static str,
    table: &DeviceTensor<R>,
    tokens: usize,
    out: &DeviceTensor<R>,
) -> Result<()> {
    if table.rank() != 2 || table.numel() == 0 {
        return Err(OpsError::shape(
            op,
            format!("table {:?} must be [V, H]", table.shape()),
        ));
    }
    let hidden = table.shape()[1];
    check_same_dtype(op, table, out)?;
    if out.shape() != [tokens, hidden] {
        return Err(OpsError::shape(
            op,
            format!("out {:?}, expected [{tokens}, {hidden}]", out.shape()),
        ));
    }
    if !(table.is_contiguous() && out.is_contiguous()) {
        return Err(OpsError::shape(op, "every operand must be contiguous"));
    }
    Ok(())
}

/// `table[ids]`: `table[V, H]` (float), `ids[T]` (u32 or i32, on the device) -> `[T, H]`.
///
/// Ids outside `[0, V)` are clamped to row `V - 1` in the kernel (the ids live on the device, so
/// checking them on the host would cost a read and a sync per call); the model validates token
/// ids when it tokenizes.
pub fn embedding<R: Runtime>(
    client: &ComputeClient<R>,
    table: &DeviceTensor<R>,
    ids: &DeviceTensor<R>,
) -> Result<DeviceTensor<R>> {
    let out = DeviceTensor::empty(client, &[ids.numel(), table.last_dim()], table.dtype());
    embedding_into(client, table, ids, &out)?;
    Ok(out)
}

/// [`embedding`] into a preallocated `out[T, H]`.
pub fn embedding_into<R: Runtime>(
    client: &ComputeClient<R>,
    table: &DeviceTensor<R>,
    ids: &DeviceTensor<R>,
    out: &DeviceTensor<R>,
) -> Result<()> {
    const OP: &str = "embedding";
    caps::check_float_dtype(client, OP, table.dtype())?;
    if !matches!(ids.dtype(), DType::U32 | DType::I32) {
        return Err(OpsError::UnsupportedDType {
            op: OP,
            dtype: ids.dtype(),
            runtime: caps::runtime_name(client),
            detail: "ids must be u32 or i32".into(),
        });
    }
    let tokens = ids.numel();
    if ids.rank() != 1 || tokens == 0 {
        return Err(OpsError::shape(
            OP,
            format!("ids {:?} must be [T] with T > 0", ids.shape()),
        ));
    }
    if !ids.is_contiguous() {
        return Err(OpsError::shape(OP, "every operand must be contiguous"));
    }
    check_gather(OP, table, tokens, out)?;
    let (vocab, hidden) = (table.shape()[0], table.shape()[1]);
    let vector = caps::vector_size_for(client, table.dtype(), hidden);
    let row_vectors = hidden / vector;
    unsafe {
        embedding_kernel::launch_unchecked::<R>(
            client,
            cube_count_1d(client, tokens as u32),
            CubeDim::new_1d((row_vectors as u32).next_power_of_two().clamp(32, 256)),
            vector,
            table.as_buffer_arg(),
            ids.as_buffer_arg(),
            out.as_buffer_arg(),
            tokens,
            vocab as u32,
            row_vectors,
            [table.dtype().elem_type(), ids.dtype().elem_type()],
        );
    }
    Ok(())
}
