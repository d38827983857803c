//! The tensor-core GEMM's compile key and the sizes derived from it.

use crate::gemm::{EpilogueBlueprint, FragmentGrid, TileCopy, FRAG};

/// Padding (elements) of every shared row: a pitch of `BK + 8` elements is an odd multiple of 16
/// bytes, so the 8 rows of an 8x8 fragment load and the 16-byte copies into a row land in
/// different bank groups.
pub(crate) const PAD: usize = 8;
/// Lanes of a plane (the kernel assumes 32; see `supported`).
pub(crate) const PLANE: usize = 32;

/// Comptime configuration of the tensor-core GEMM (the kernel's compile key): the launch's
/// [`CmmaTile`](super::CmmaTile) with the pipeline depth the runtime allows, the vector width
/// and the epilogue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CmmaBlueprint {
    pub bm: u32,
    pub bn: u32,
    pub bk: u32,
    pub warps_m: u32,
    pub warps_n: u32,
    /// `cp.async` pipeline depth (2 to 8), or 0 for the register-staged double buffer.
    pub stages: u32,
    /// Elements per vector of x and w (the kernel's `N`).
    pub vector: u32,
    pub group_m: u32,
    /// Gated (`epilogue.gate`): a B tile holds `bn / 2` gate rows then the matching up rows.
    pub epilogue: EpilogueBlueprint,
}

impl CmmaBlueprint {
    pub(crate) fn gated(&self) -> bool {
        self.epilogue.is_gated()
    }
    pub(crate) fn units(&self) -> usize {
        (self.warps_m * self.warps_n) as usize * PLANE
    }
    pub(crate) fn ldk(&self) -> usize {
        self.bk as usize + PAD
    }
    /// Vectors per shared row.
    pub(crate) fn pitch(&self) -> usize {
        self.ldk() / self.vector as usize
    }
    /// Vectors of one step of K per row.
    pub(crate) fn row_vectors(&self) -> usize {
        self.bk as usize / self.vector as usize
    }
    pub(crate) fn buffers(&self) -> usize {
        if self.stages == 0 {
            2
        } else {
            self.stages as usize
        }
    }
    fn tile(&self, rows: u32, stacked: Option<usize>) -> TileCopy {
        TileCopy {
            rows: rows as usize,
            row_vectors: self.row_vectors(),
            pitch: self.pitch(),
            units: self.units(),
            stacked,
        }
    }
    /// One K step of A: `bm` rows of x.
    pub(crate) fn a_tile(&self) -> TileCopy {
        self.tile(self.bm, None)
    }
    /// One K step of B: `bn` weight rows; gated, `bn / 2` gate rows of w then the matching up
    /// rows of w_up.
    pub(crate) fn b_tile(&self) -> TileCopy {
        self.tile(self.bn, self.gated().then_some(self.bn as usize / 2))
    }
    pub(crate) fn plane_rows(&self) -> usize {
        (self.bm / self.warps_m) as usize
    }
    pub(crate) fn plane_cols(&self) -> usize {
        (self.bn / self.warps_n) as usize
    }
    pub(crate) fn frags_m(&self) -> usize {
        self.plane_rows() / FRAG
    }
    /// B fragments per plane (gate and up together when gated).
    pub(crate) fn frags_n(&self) -> usize {
        self.plane_cols() / FRAG
    }
    /// A plane's accumulators, for the epilogue.
    pub(crate) fn grid(&self) -> FragmentGrid {
        FragmentGrid {
            frags_m: self.frags_m(),
            frags_n: self.frags_n(),
            planes: (self.warps_m * self.warps_n) as usize,
        }
    }
    /// The B-tile row of plane 0's `j`-th B fragment (plane `wn` adds `wn * b_plane_step`).
    pub(crate) fn frag_b_row(&self, j: usize) -> usize {
        if self.gated() {
            let half = self.frags_n() / 2;
            if j < half {
                j * FRAG
            } else {
                self.bn as usize / 2 + (j - half) * FRAG
            }
        } else {
            j * FRAG
        }
    }
    /// B rows (and output columns) between neighbouring planes along N.
    pub(crate) fn b_plane_step(&self) -> usize {
        if self.gated() {
            self.plane_cols() / 2
        } else {
            self.plane_cols()
        }
    }
    /// Output columns one tile covers.
    pub(crate) fn out_cols(&self) -> usize {
        if self.gated() {
            self.bn as usize / 2
        } else {
            self.bn as usize
        }
    }
    /// Length of the shared slice a fragment load covers, in vectors.
    pub(crate) fn frag_len(&self) -> usize {
        ((FRAG - 1) * self.ldk() + FRAG) / self.vector as usize
    }
}
