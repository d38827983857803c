//! The add investigation's variants against the f64 reference on every runtime present: other
//! launch shapes (including a cube count that spills past the x maximum, which forces the 3-D
//! index of `ops::launch::Grid`) and the inline-PTX variants (CUDA only; elsewhere the typed
//! error).

use cubecl::prelude::*;
use lab::add_variants::{add_into_with, AddHint, AddLaunch, ADD_LAUNCH};
use ops::reference::elementwise as reference;
use ops::DeviceTensor;
use testkit::*;

/// `a + b` into a NaN-poisoned output through [`add_into_with`], against the reference.
fn check_add<R: Runtime>(
    client: &ComputeClient<R>,
    what: &str,
    [a, b]: [&DeviceTensor<R>; 2],
    [ah, bh]: [&[f64]; 2],
    launch: AddLaunch,
) {
    let out = poisoned(client, a.shape(), a.dtype());
    add_into_with(client, a, b, &out, launch).unwrap();
    assert_close(
        what,
        &out.to_f64_vec(client).unwrap(),
        &reference::add(ah, bh),
        tolerance(a.dtype()),
    );
}

/// The portable add under other launch shapes: the 3-D index (`flat_index: false`), several
/// strided vectors per unit, and one unit per cube, which makes 75 000 cubes (f16) or 150 000
/// (f32) for 1000 x 600: past wgpu's 65 535 along x, so there the cube count spills to y and the
/// kernel must take the 3-D index even when asked for the flat one.
fn add_launch_shapes_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(27);
    let shapes = [
        AddLaunch {
            flat_index: false,
            ..ADD_LAUNCH
        },
        AddLaunch {
            units: 128,
            per_unit: 4,
            ..ADD_LAUNCH
        },
        AddLaunch {
            units: 1,
            per_unit: 1,
            ..ADD_LAUNCH
        },
        AddLaunch {
            units: 1,
            per_unit: 1,
            flat_index: false,
            ..ADD_LAUNCH
        },
    ];
    for dtype in float_dtypes(client) {
        for (rows, n) in [(3usize, 17usize), (1000, 600)] {
            let (a, ah) = upload(client, &random(&mut rng, rows * n, 2.0), &[rows, n], dtype);
            let (b, bh) = upload(client, &random(&mut rng, rows * n, 2.0), &[rows, n], dtype);
            let (r, rh) = upload(client, &random(&mut rng, n, 2.0), &[n], dtype);
            for launch in shapes {
                let what = format!("add {dtype} {rows}x{n} {launch:?}");
                check_add(client, &what, [&a, &b], [&ah, &bh], launch);
                let what = format!("{what} row");
                check_add(client, &what, [&a, &r], [&ah, &rh], launch);
            }
        }
    }
}

/// The inline-PTX add variants (CUDA only) against the reference: shapes in whole 16-byte vectors,
/// one and several waves of cubes with a partial last one; elsewhere, the typed errors.
fn add_ptx_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(25);
    let cuda = ops::caps::runtime_name(client).contains("cuda");
    for hint in [
        AddHint::Ptx,
        AddHint::Stream,
        AddHint::StreamStores,
        AddHint::StreamLoads,
    ] {
        let launch = AddLaunch { hint, ..ADD_LAUNCH };
        for dtype in float_dtypes(client) {
            for (rows, n) in [(1usize, 8usize), (3, 1000), (4099, 2056)] {
                let (a, ah) = upload(client, &random(&mut rng, rows * n, 2.0), &[rows, n], dtype);
                let (b, bh) = upload(client, &random(&mut rng, rows * n, 2.0), &[rows, n], dtype);
                let out = poisoned(client, &[rows, n], dtype);
                let what = format!("add {hint:?} {dtype} {rows}x{n}");
                if !cuda {
                    assert_err(
                        &what,
                        add_into_with(client, &a, &b, &out, launch),
                        "feature",
                    );
                    continue;
                }
                add_into_with(client, &a, &b, &out, launch).unwrap();
                assert_close(
                    &what,
                    &out.to_f64_vec(client).unwrap(),
                    &reference::add(&ah, &bh),
                    tolerance(dtype),
                );
            }
            if cuda {
                // Not whole 16-byte vectors, or a broadcast row: refused, not miscomputed.
                let (a, _) = upload(client, &random(&mut rng, 3 * 17, 2.0), &[3, 17], dtype);
                let (r, _) = upload(client, &random(&mut rng, 17, 2.0), &[17], dtype);
                let out = poisoned(client, &[3, 17], dtype);
                let bad = add_into_with(client, &a, &a, &out, launch);
                assert_err(&format!("{hint:?} {dtype} 3x17"), bad, "argument");
                let bad = add_into_with(client, &a, &r, &out, launch);
                assert_err(&format!("{hint:?} {dtype} row"), bad, "argument");
            }
        }
    }
}

#[test]
fn add_launch_shapes_match_reference() {
    on_each_runtime!(add_launch_shapes_case);
}

#[test]
fn add_ptx_matches_reference() {
    on_each_runtime!(add_ptx_case);
}
