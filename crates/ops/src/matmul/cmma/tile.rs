//! The tile of a tensor-core GEMM launch and how it is chosen per shape.

use super::blueprint::{PAD, PLANE};
use crate::gemm::FRAG;

/// The shape of one tensor-core GEMM launch: the cube's tile, its planes and the pipeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CmmaTile {
    /// Rows of x per tile.
    pub bm: u32,
    /// Rows of w per tile: the output columns of a plain GEMM; for the gated MLP half of them
    /// are gate rows and half up rows, so a tile covers `bn / 2` output columns.
    pub bn: u32,
    /// K per pipeline step: 32 or 64.
    pub bk: u32,
    pub warps_m: u32,
    pub warps_n: u32,
    /// `cp.async` pipeline depth (2 to 8), or 0 for the register-staged double buffer.
    pub stages: u32,
}

impl CmmaTile {
    /// 128x128, 4 planes of 64x64, BK = 32, 3 stages: the default for large plain GEMMs (the
    /// tile sweep measured on an H100: ahead of 8 planes of 64x32 by 5-20%, a 64x64 plane tile
    /// reads half the shared memory per `mma`).
    pub const LARGE: Self = Self::new(128, 128, 2, 2, 3);
    /// [`LARGE`](Self::LARGE) with a 4-stage pipeline: the long-K (>= 4096) shapes.
    pub const LARGE_DEEP: Self = Self::new(128, 128, 2, 2, 4);
    /// 128x128, 8 planes of 64x32: the gated MLP (gate and up fragments per plane), where it
    /// measured ahead of the 4-plane tile.
    pub const LARGE_GATED: Self = Self::new(128, 128, 2, 4, 3);
    /// 64x128, 8 planes of 32x32.
    pub const MEDIUM: Self = Self::new(64, 128, 2, 4, 3);
    /// 64x64, 4 planes of 32x32: where 128x128 tiles cannot fill the SMs (the 1.5B model's
    /// qkv/o/down projections at M = 512: 1.4-1.8x faster there than 128x128).
    pub const SMALL: Self = Self::new(64, 64, 2, 2, 3);

    /// A tile with `BK = 32`.
    pub const fn new(bm: u32, bn: u32, warps_m: u32, warps_n: u32, stages: u32) -> Self {
        Self {
            bm,
            bn,
            bk: 32,
            warps_m,
            warps_n,
            stages,
        }
    }

    /// The same tile with another `BK`.
    pub const fn with_bk(self, bk: u32) -> Self {
        Self { bk, ..self }
    }

    pub fn units(&self) -> u32 {
        self.warps_m * self.warps_n * PLANE as u32
    }

    /// Output columns one tile covers.
    pub fn out_cols(&self, gated: bool) -> usize {
        if gated {
            self.bn as usize / 2
        } else {
            self.bn as usize
        }
    }

    /// Whether the kernel can run this tile (plane blocks whole fragments, and for the gated
    /// MLP an even number of B fragments per plane: gate and up halves).
    pub fn is_valid(&self, gated: bool) -> bool {
        let planes = self.warps_m * self.warps_n;
        if self.warps_m == 0 || self.warps_n == 0 || planes > 32 || self.bm == 0 || self.bn == 0 {
            return false;
        }
        let (pm, pn) = (self.bm / self.warps_m, self.bn / self.warps_n);
        self.bm.is_multiple_of(self.warps_m)
            && self.bn.is_multiple_of(self.warps_n)
            && pm.is_multiple_of(FRAG as u32)
            && pn.is_multiple_of(FRAG as u32)
            && (!gated || (pn / FRAG as u32).is_multiple_of(2))
            && (pm / FRAG as u32) * (pn / FRAG as u32) <= 32
            && (self.bk == 32 || self.bk == 64)
            && (self.stages == 0 || (2..=8).contains(&self.stages))
    }

    /// Buffers of shared memory (the register path double-buffers).
    fn buffers(&self) -> usize {
        if self.stages == 0 {
            2
        } else {
            self.stages as usize
        }
    }

    /// Shared memory one cube uses, in bytes, for `elem` bytes per element.
    pub fn shared_bytes(&self, elem: usize, gated: bool) -> usize {
        let stages = self.buffers() * (self.bm + self.bn) as usize * (self.bk as usize + PAD);
        let scratch = if gated { 2 } else { 1 } * FRAG * FRAG * 4;
        stages * elem + scratch * (self.warps_m * self.warps_n) as usize + 64 * self.buffers()
    }

    /// Parses `bm,bn,warps_m,warps_n,stages[,bk]` (e.g. `128,128,2,4,3`; the benchmark's
    /// `--gemm-tile`); `None` unless it describes a tile valid for a plain GEMM.
    pub fn parse(text: &str) -> Option<Self> {
        let v: Vec<u32> = text
            .split(',')
            .map(|s| s.trim().parse().ok())
            .collect::<Option<_>>()?;
        let tile = match v[..] {
            [bm, bn, wm, wn, st] => Self::new(bm, bn, wm, wn, st),
            [bm, bn, wm, wn, st, bk] => Self::new(bm, bn, wm, wn, st).with_bk(bk),
            _ => return None,
        };
        tile.is_valid(false).then_some(tile)
    }

    /// The default tile for an `m x n` output with inner dimension `k` on `sms` SMs: 128x128
    /// when that gives at least ~3/4 of a cube per SM (deeper pipeline for K >= 4096, 8 planes
    /// when gated), else [`SMALL`](Self::SMALL). Measured on an H100.
    pub fn auto(m: usize, n: usize, k: usize, gated: bool, sms: usize) -> Self {
        let large = match (gated, k >= 4096) {
            (true, _) => Self::LARGE_GATED,
            (false, true) => Self::LARGE_DEEP,
            (false, false) => Self::LARGE,
        };
        let tiles = m.div_ceil(large.bm as usize) * n.div_ceil(large.out_cols(gated));
        if 4 * tiles >= 3 * sms {
            large
        } else {
            Self::SMALL
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tune_syntax() {
        assert_eq!(CmmaTile::parse("128,128,2,2,3"), Some(CmmaTile::LARGE));
        assert_eq!(
            CmmaTile::parse(" 128, 256 ,2,4,4,64"),
            Some(CmmaTile::new(128, 256, 2, 4, 4).with_bk(64))
        );
        assert_eq!(
            CmmaTile::parse("64,64,2,2,0"),
            Some(CmmaTile::new(64, 64, 2, 2, 0))
        );
        for bad in [
            "",
            "128,128,2,4",
            "128,128,2,4,1",
            "128,128,3,4,3",
            "100,128,2,4,3",
        ] {
            assert_eq!(CmmaTile::parse(bad), None, "{bad}");
        }
        assert_eq!(CmmaTile::parse("128,128,2,4,3,48"), None);
        assert_eq!(CmmaTile::parse("a,b,c,d,e"), None);
    }

    #[test]
    fn default_tiles() {
        let sms = 132;
        // 512x4096: 128 big tiles, ~1 per SM; K = 4096 -> the deep pipeline.
        assert_eq!(
            CmmaTile::auto(512, 4096, 4096, false, sms),
            CmmaTile::LARGE_DEEP
        );
        assert_eq!(
            CmmaTile::auto(4096, 4096, 4096, false, sms),
            CmmaTile::LARGE_DEEP
        );
        // qkv: 64 big tiles -> 64x64 (256 cubes); o/down: 48 -> 192 cubes.
        assert_eq!(CmmaTile::auto(512, 2048, 1536, false, sms), CmmaTile::SMALL);
        assert_eq!(CmmaTile::auto(512, 1536, 8960, false, sms), CmmaTile::SMALL);
        assert_eq!(
            CmmaTile::auto(512, 17920, 1536, false, sms),
            CmmaTile::LARGE
        );
        assert_eq!(
            CmmaTile::auto(512, 8960, 1536, true, sms),
            CmmaTile::LARGE_GATED
        );
        for t in [
            CmmaTile::LARGE,
            CmmaTile::LARGE_DEEP,
            CmmaTile::LARGE_GATED,
            CmmaTile::MEDIUM,
            CmmaTile::SMALL,
        ] {
            assert!(t.is_valid(false) && t.is_valid(true), "{t:?}");
            // Fits the 227 KB an H100 cube may opt into, with room for 2 cubes per SM.
            assert!(t.shared_bytes(2, true) <= 113 * 1024, "{t:?}");
        }
        assert!(!CmmaTile::new(64, 64, 2, 4, 3).is_valid(true));
    }
}
