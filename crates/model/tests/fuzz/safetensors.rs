//! Safetensors files and sharded indexes: `WeightStore::{open, open_file}`, `get`, `expect`,
//! `i32s`, `TensorRef::{bytes_as, to_f32}` and `weights::convert`.

use std::path::Path;

use model::weights::convert;
use model::{ModelError, WeightStore};
use ops::DType;
use serde_json::{json, Value};

use super::harness::{self, mutate_bytes, mutate_json, show_bytes, Case, Fuzz, TempDir};

/// `(name, safetensors dtype, ops dtype if the loader accepts it, shape)` of the seed file.
const TENSORS: [(&str, &str, Option<DType>, &[usize]); 7] = [
    (
        "model.embed_tokens.weight",
        "BF16",
        Some(DType::BF16),
        &[4, 2],
    ),
    ("a.f32", "F32", Some(DType::F32), &[2, 3]),
    ("b.f16", "F16", Some(DType::F16), &[3]),
    ("ids", "I32", Some(DType::I32), &[5]),
    ("bytes", "U8", Some(DType::U8), &[7]),
    ("scalar", "F32", Some(DType::F32), &[]),
    ("empty", "F32", Some(DType::F32), &[0, 4]),
];

/// A valid header (as JSON) and data section for [`TENSORS`], with values that include
/// f16-overflowing, infinite and NaN floats.
fn seed_file(fz: &mut Fuzz) -> (Value, Vec<u8>) {
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), json!({"format": "pt"}));
    let mut data = Vec::new();
    for (name, st, _, shape) in TENSORS {
        let numel: usize = shape.iter().product();
        let start = data.len();
        for _ in 0..numel {
            let v = *fz.pick(&[0.5f32, -2.0, 1e30, f32::INFINITY, f32::NAN, 70000.0, 3.25]);
            match st {
                "F32" => data.extend(v.to_le_bytes()),
                "F16" => data.extend(half::f16::from_f32(v).to_bits().to_le_bytes()),
                "BF16" => data.extend(half::bf16::from_f32(v).to_bits().to_le_bytes()),
                "I32" => data.extend((fz.u64() as i32).to_le_bytes()),
                _ => data.push(fz.u64() as u8),
            }
        }
        header.insert(
            name.into(),
            json!({"dtype": st, "shape": shape, "data_offsets": [start, data.len()]}),
        );
    }
    (Value::Object(header), data)
}

/// 8-byte little-endian header length, header, data.
fn assemble(header_len: u64, header: &[u8], data: &[u8]) -> Vec<u8> {
    let mut out = header_len.to_le_bytes().to_vec();
    out.extend_from_slice(header);
    out.extend_from_slice(data);
    out
}

/// Replaces a part of one tensor entry with something invalid or odd; returns a reason when the
/// file can no longer be valid.
fn mutate_entry(fz: &mut Fuzz, entry: &mut Value, file_end: u64) -> Option<&'static str> {
    let (s, e) = (
        entry["data_offsets"][0].as_u64().unwrap_or(0),
        entry["data_offsets"][1].as_u64().unwrap_or(0),
    );
    match fz.below(18) {
        0 if e > s => {
            entry["data_offsets"] = json!([e, s]);
            Some("reversed offsets")
        }
        1 => {
            entry["data_offsets"] = json!([s, file_end + 1 + fz.below(1 << 20) as u64]);
            Some("offsets beyond the file")
        }
        2 => {
            entry["data_offsets"] = json!([s, fz.interesting_u64()]);
            None
        }
        3 => {
            entry["data_offsets"] = json!(*fz.pick(&[
                json!([-1, e]),
                json!([s, -8]),
                json!([s as f64 + 0.5, e]),
                json!(["0", e]),
                json!([s]),
                json!([s, e, e]),
                json!(null)
            ]));
            Some("offsets that are not two non-negative integers")
        }
        4 => {
            let huge = *fz.pick(&[1u64 << 32, 1 << 33, u64::MAX, 1 << 62]);
            entry["shape"] = json!([huge, huge, 16]);
            Some("a shape whose element count overflows")
        }
        5 => {
            entry["shape"] = json!(*fz.pick(&[
                json!([-1]),
                json!([2.5]),
                json!(["3"]),
                json!(null),
                json!([[2]])
            ]));
            Some("a shape that is not a list of non-negative integers")
        }
        6 => {
            // The same element count in another arrangement, or a different count.
            let shape: Vec<u64> =
                serde_json::from_value(entry["shape"].clone()).unwrap_or_default();
            let numel: u64 = shape.iter().product();
            entry["shape"] = json!(*fz.pick(&[
                json!([numel]),
                json!([numel + 1]),
                json!([1, numel, 1]),
                json!([0])
            ]));
            None
        }
        7 => {
            let d = *fz.pick(&[
                "F64", "I64", "BOOL", "F8_E4M3", "F8_E5M2", "U16", "I16", "I8", "U32", "U64",
                "C64", "F4", "F6_E2M3", "E8M0", "Q4_K", "f32", "",
            ]);
            entry["dtype"] = json!(d);
            None
        }
        8 => {
            entry["dtype"] = json!(*fz.pick(&[json!(5), json!(null), json!(["F32"])]));
            Some("a dtype that is not a string")
        }
        9 => {
            let field = *fz.pick(&["dtype", "shape", "data_offsets"]);
            entry.as_object_mut().expect("an entry").remove(field);
            Some("a tensor entry with a field missing")
        }
        10 => {
            entry["extra"] = harness::random_json(fz, 2);
            None
        }
        12 | 13 => {
            // Another dtype of the same width: the file stays valid.
            let same_width: &[&str] = match entry["dtype"].as_str() {
                Some("F32" | "I32") => &["F32", "I32", "U32"],
                Some("F16" | "BF16") => &["F16", "BF16", "I16", "U16"],
                _ => &["U8", "I8", "BOOL", "F8_E4M3", "F8_E5M2"],
            };
            entry["dtype"] = json!(*fz.pick(same_width));
            None
        }
        11 if e > s => {
            // Overlaps the previous tensor or leaves a gap.
            let d = 1 + fz.below(4) as u64;
            entry["data_offsets"] = json!([s.saturating_sub(d), e]);
            None
        }
        _ => {
            mutate_json(fz, entry, &["dtype", "shape", "data_offsets"]);
            None
        }
    }
}

/// A mutated safetensors file and, when it must be refused, why.
fn mutated_file(fz: &mut Fuzz) -> (Vec<u8>, Option<&'static str>) {
    let (mut header, mut data) = seed_file(fz);
    let mut must_fail = None;
    let file_end = data.len() as u64;
    for _ in 0..1 + fz.below(2) {
        let Some(map) = header.as_object_mut().filter(|_| must_fail.is_none()) else {
            break;
        };
        match fz.below(10) {
            0..=4 => {
                let name = TENSORS[fz.below(TENSORS.len())].0;
                if let Some(entry) = map.get_mut(name).filter(|e| e.is_object()) {
                    must_fail = must_fail.or(mutate_entry(fz, entry, file_end));
                }
            }
            5 => {
                map.insert(
                    "__metadata__".into(),
                    json!(*fz.pick(&[
                        json!([1, 2]),
                        json!(7),
                        json!({"a": {"b": 1}}),
                        json!({"format": 5}),
                        json!(null),
                        json!({"dtype": "F32", "shape": [1], "data_offsets": [0, 4]})
                    ])),
                );
            }
            6 => {
                let name = TENSORS[fz.below(TENSORS.len())].0;
                map.remove(name);
            }
            7 => {
                let name = fz.pick(&["", "\u{0}", "ü/../x", "a.f32 "]).to_string();
                map.insert(
                    name,
                    json!({"dtype": "U8", "shape": [1], "data_offsets": [file_end, file_end + 1]}),
                );
                data.push(1);
            }
            8 => {
                header = harness::random_json(fz, 2);
                must_fail =
                    must_fail.or((!header.is_object()).then_some("a header that is not an object"));
                break;
            }
            _ => mutate_json(fz, &mut header, &["a.f32", "ids", "__metadata__"]),
        }
    }
    let mut header_text = serde_json::to_string(&header).expect("serialise");
    if must_fail.is_none() && fz.chance(10) {
        // A duplicate name: both entries are in the text, the second with other offsets.
        header_text.pop();
        header_text.push_str(r#","a.f32":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#);
    }
    if fz.chance(20) {
        header_text.push_str(&" ".repeat(fz.below(9)));
    }
    let mut header_len = header_text.len() as u64;
    match fz.below(20) {
        0 => {
            header_len = *fz.pick(&[1 << 60, u64::MAX, 1 << 63, 1 << 32, 100_000_001]);
            must_fail = Some("a header length past the end of the file");
        }
        1 => header_len = header_len.wrapping_add(fz.below(17) as u64).wrapping_sub(8),
        2 => header_len = fz.interesting_u64(),
        _ => {}
    }
    let mut bytes = assemble(header_len, header_text.as_bytes(), &data);
    match fz.below(10) {
        0 => {
            let at = fz.below(bytes.len());
            bytes.truncate(at);
            // Cut inside the header: its length now points past the end. (A cut in the data
            // section can leave a valid file when the header lists fewer bytes than follow.)
            if (at as u64) < 8u64.saturating_add(header_len) {
                must_fail = Some("a file cut inside its header");
            }
        }
        1 => {
            let n = 1 + fz.below(8);
            bytes.extend(fz.bytes(n));
        }
        2 | 3 => {
            mutate_bytes(fz, &mut bytes);
            must_fail = None;
        }
        _ => {}
    }
    (bytes, must_fail)
}

fn one_line(e: &ModelError) -> Result<(), String> {
    let msg = e.to_string();
    if msg.contains('\n') {
        return Err(format!("error message spans lines: {msg:?}"));
    }
    Ok(())
}

/// Checks everything a store opened from `bytes` hands out: each tensor's bytes are the
/// `data_offsets` range of its header entry, inside the file; conversions succeed or fail typed.
fn check_store(store: &WeightStore, bytes: &[u8]) -> Result<(), String> {
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    let data_start = 8 + n;
    let header: Value = serde_json::from_slice(&bytes[8..data_start])
        .map_err(|e| format!("opened although the header is not JSON: {e}"))?;
    if store.names().len() != store.len() {
        return Err("names() and len() disagree".into());
    }
    for name in store.names() {
        let t = match store.get(name) {
            Ok(t) => t,
            Err(e) if e.kind() == "tensor-dtype" => {
                one_line(&e)?;
                continue;
            }
            Err(e) => return Err(format!("listed tensor '{name}' fails: {e}")),
        };
        let offsets = &header[name]["data_offsets"];
        let (s, e) = (
            offsets[0].as_u64().ok_or("no start offset")? as usize,
            offsets[1].as_u64().ok_or("no end offset")? as usize,
        );
        let data = t.read().map_err(|e| format!("'{name}': unreadable: {e}"))?;
        if data_start + e > bytes.len() || bytes[data_start + s..data_start + e] != *data {
            return Err(format!(
                "'{name}': data is not the file's bytes {s}..{e} of the data section"
            ));
        }
        let numel = t.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        if numel.and_then(|n| n.checked_mul(t.dtype.size())) != Some(data.len()) {
            return Err(format!(
                "'{name}': shape {:?} of {} does not match {} bytes",
                t.shape,
                t.dtype,
                data.len()
            ));
        }
        let numel = t.numel();
        for to in DType::FLOATS {
            match t.bytes_as(to) {
                Ok(b) if t.dtype.is_float() && b.len() == numel * to.size() => {}
                Ok(b) => {
                    return Err(format!(
                        "'{name}' {} -> {to}: {} bytes for {numel} elements",
                        t.dtype,
                        b.len()
                    ))
                }
                Err(e) if e.kind() == "tensor-value" && to == DType::F16 => one_line(&e)?,
                Err(e) if e.kind() == "tensor-dtype" && !t.dtype.is_float() => one_line(&e)?,
                Err(e) => {
                    return Err(format!(
                        "'{name}' {} -> {to}: unexpected error {e}",
                        t.dtype
                    ))
                }
            }
        }
        if t.dtype.is_float() {
            match t.to_f32() {
                Ok(v) if v.len() == numel => {}
                r => return Err(format!("'{name}': to_f32 gives {:?}", r.map(|v| v.len()))),
            }
        }
        match (store.i32s(name), t.dtype) {
            (Ok(v), DType::I32) if v.len() == numel => {}
            (Err(e), d) if d != DType::I32 && e.kind() == "tensor-dtype" => {}
            (r, d) => return Err(format!("'{name}': i32s on {d}: {:?}", r.map(|v| v.len()))),
        }
        let shape = t.shape.to_vec();
        match store.expect(name, &shape) {
            Ok(_) if t.dtype.is_float() => {}
            Err(e) if !t.dtype.is_float() && e.kind() == "tensor-dtype" => {}
            r => {
                return Err(format!(
                    "'{name}': expect with its own shape: {:?}",
                    r.map(|_| ())
                ))
            }
        }
    }
    match store.get("no.such.tensor") {
        Err(e) if e.kind() == "missing-tensor" => Ok(()),
        r => Err(format!(
            "an absent name gives {:?}",
            r.map(|t| t.name.to_string())
        )),
    }
}

/// Opens `bytes` written as a single checkpoint; see [`check_store`] for what an Ok must be.
fn open_and_check(dir: &Path, bytes: &[u8], must_fail: Option<&str>) -> Result<(), String> {
    let as_dir = bytes.len().is_multiple_of(2);
    let path = dir.join(if as_dir {
        "model.safetensors"
    } else {
        "reference.safetensors"
    });
    std::fs::write(&path, bytes).map_err(|e| e.to_string())?;
    let result = if as_dir {
        WeightStore::open(dir)
    } else {
        WeightStore::open_file(&path)
    };
    match result {
        Ok(store) => {
            if let Some(why) = must_fail {
                return Err(format!("opened a file with {why}"));
            }
            check_store(&store, bytes)
        }
        Err(e) => {
            one_line(&e)?;
            if !matches!(e.kind(), "safetensors" | "io") {
                return Err(format!("unexpected error kind {}: {e}", e.kind()));
            }
            if !e
                .to_string()
                .contains(path.file_name().unwrap().to_str().unwrap())
            {
                return Err(format!("error does not name the file: {e}"));
            }
            Ok(())
        }
    }
}

#[test]
fn mutated_safetensors_files_open_or_fail_typed_and_tensors_lie_inside_the_file() {
    let dir = std::sync::Arc::new(TempDir::new("st"));
    harness::run("safetensors", 1, 1500, |fz, _| {
        let (bytes, must_fail) = mutated_file(fz);
        let input = format!("{} (must fail: {must_fail:?})", show_bytes(&bytes));
        let dir = dir.clone();
        Case::new(input, move || open_and_check(dir.path(), &bytes, must_fail))
    });
}

const SHARDS: [&str; 2] = [
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
];

/// A valid shard holding `names` (F32 `[2]` each).
fn shard(names: &[&str]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    for (i, name) in names.iter().enumerate() {
        header.insert(
            name.to_string(),
            json!({"dtype": "F32", "shape": [2], "data_offsets": [8 * i, 8 * i + 8]}),
        );
    }
    let text = serde_json::to_string(&header).unwrap();
    assemble(
        text.len() as u64,
        text.as_bytes(),
        &vec![0; 8 * names.len()],
    )
}

#[test]
fn mutated_sharded_indexes_open_or_fail_typed_and_never_leave_the_directory() {
    harness::run("sharded-index", 2, 600, |fz, _| {
        let mut index = json!({
            "metadata": {"total_size": 24},
            "weight_map": {"x": SHARDS[0], "y": SHARDS[0], "z": SHARDS[1]},
        });
        let mut shards = vec![shard(&["x", "y"]), shard(&["z"])];
        for _ in 0..1 + fz.below(2) {
            let name = *fz.pick(&["x", "y", "z", "new"]);
            let entry = match fz.below(8) {
                0 => Some(json!(*fz.pick(&[
                    "../outside.safetensors",
                    "sub/../../outside.safetensors",
                    "/tmp/outside.safetensors",
                    "..",
                    "./../outside.safetensors"
                ]))),
                1 => Some(json!(*fz.pick(&[
                    "",
                    ".",
                    "missing.safetensors",
                    "sub/",
                    SHARDS[1],
                    SHARDS[0],
                    "model.safetensors.index.json"
                ]))),
                2 => Some(
                    fz.pick(&[json!(5), json!(null), json!([SHARDS[0]]), json!({})])
                        .clone(),
                ),
                3 => {
                    index["weight_map"] = fz
                        .pick(&[json!([]), json!("x"), json!(null), json!({}), json!(7)])
                        .clone();
                    None
                }
                4 => {
                    let i = fz.below(2);
                    mutate_bytes(fz, &mut shards[i]);
                    None
                }
                5 => {
                    let mut text = serde_json::to_vec(&index).unwrap();
                    mutate_bytes(fz, &mut text);
                    index = serde_json::from_slice(&text).unwrap_or(Value::Null);
                    None
                }
                _ => {
                    mutate_json(fz, &mut index, &["weight_map", "metadata", "x"]);
                    None
                }
            };
            if let (Some(v), Some(map)) = (
                entry,
                index.get_mut("weight_map").and_then(Value::as_object_mut),
            ) {
                map.insert(name.to_string(), v);
            }
        }
        // What the index must be refused for, whatever the mutations did.
        let must_fail = match index.get("weight_map").and_then(Value::as_object) {
            None => Some("no weight_map object"),
            Some(map) => map.values().find_map(|v| match v.as_str() {
                None => Some("a shard that is not a file name"),
                Some(s) if s.contains("..") || s.starts_with('/') => {
                    Some("a shard outside the model directory")
                }
                Some(_) => None,
            }),
        };
        let input = format!(
            "index {index}; shards {} / {}",
            show_bytes(&shards[0]),
            show_bytes(&shards[1])
        );
        Case::new(input, move || {
            let root = TempDir::new("shards");
            let dir = root.path().join("model");
            std::fs::create_dir_all(dir.join("sub")).unwrap();
            // A valid file just outside the model directory, which an index must not reach.
            std::fs::write(
                root.path().join("outside.safetensors"),
                shard(&["x", "y", "z", "new"]),
            )
            .unwrap();
            for (name, bytes) in SHARDS.iter().zip(&shards) {
                std::fs::write(dir.join(name), bytes).unwrap();
            }
            let index_text = if index.is_null() {
                b"{not json".to_vec()
            } else {
                serde_json::to_vec(&index).unwrap()
            };
            std::fs::write(dir.join("model.safetensors.index.json"), index_text).unwrap();
            match WeightStore::open(&dir) {
                Err(e) => one_line(&e),
                Ok(_) if must_fail.is_some() => Err(format!("opened an index with {must_fail:?}")),
                Ok(store) => {
                    let map = index["weight_map"]
                        .as_object()
                        .ok_or("opened without a weight_map object")?;
                    if store.len() != map.len() {
                        return Err(format!(
                            "{} tensors for {} index entries",
                            store.len(),
                            map.len()
                        ));
                    }
                    for name in map.keys() {
                        store
                            .get(name)
                            .map_err(|e| format!("indexed tensor '{name}': {e}"))?;
                    }
                    Ok(())
                }
            }
        })
    });
}

#[test]
fn convert_of_random_bytes_and_dtypes_is_ok_with_the_right_length_or_a_typed_error() {
    harness::run("convert", 3, 2000, |fz, _| {
        let n = fz.below(40);
        let data = fz.bytes(n);
        let (from, to) = (*fz.pick(&DType::ALL), *fz.pick(&DType::ALL));
        let input = format!("{from} -> {to}: {}", show_bytes(&data));
        Case::new(input, move || match convert("t", &data, from, to) {
            Ok(out) if from == to && *out == *data => Ok(()),
            Ok(out)
                if from.is_float()
                    && to.is_float()
                    && out.len() == data.len() / from.size() * to.size() =>
            {
                Ok(())
            }
            Ok(out) => Err(format!("{} bytes out", out.len())),
            Err(e) if e.kind() == "tensor-dtype" && !(from.is_float() && to.is_float()) => {
                one_line(&e)
            }
            Err(e) if e.kind() == "tensor-value" && to == DType::F16 => one_line(&e),
            Err(e) => Err(format!("unexpected error {e}")),
        })
    });
}

/// Fixed inputs: header lengths and shapes that must be refused before anything is allocated
/// from them (the fuzz allocator caps single allocations, see `testkit::fuzz::ALLOC_CAP`).
#[test]
fn huge_header_lengths_and_overflowing_shapes_are_errors_before_allocation() {
    let dir = std::sync::Arc::new(TempDir::new("st-fixed"));
    let header = br#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#;
    let mut cases: Vec<(String, Vec<u8>)> =
        [1u64 << 60, u64::MAX, 1 << 63, header.len() as u64 + 5]
            .into_iter()
            .map(|n| (format!("header length {n}"), assemble(n, header, &[0; 4])))
            .collect();
    for shape in [
        "[4294967296,4294967296,16]",
        "[18446744073709551615,2]",
        "[-1]",
        "[2.5]",
    ] {
        let h = format!(r#"{{"a":{{"dtype":"F32","shape":{shape},"data_offsets":[0,4]}}}}"#);
        cases.push((
            format!("shape {shape}"),
            assemble(h.len() as u64, h.as_bytes(), &[0; 4]),
        ));
    }
    for offsets in ["[4,0]", "[0,1152921504606846976]", "[0,-4]", "[0.5,4]"] {
        let h = format!(r#"{{"a":{{"dtype":"F32","shape":[1],"data_offsets":{offsets}}}}}"#);
        cases.push((
            format!("offsets {offsets}"),
            assemble(h.len() as u64, h.as_bytes(), &[0; 4]),
        ));
    }
    for (i, (what, bytes)) in cases.into_iter().enumerate() {
        let dir = dir.clone();
        let input = format!("{what}: {}", show_bytes(&bytes));
        harness::run_case(
            "safetensors-fixed",
            i as u64,
            Case::new(input, move || {
                open_and_check(dir.path(), &bytes, Some("an invalid header"))
            }),
        );
    }
}
