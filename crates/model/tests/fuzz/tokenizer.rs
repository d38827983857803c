//! Tokenizer and chat template loading: `Tokenizer::from_dir` over mutated `tokenizer.json` /
//! `tokenizer_config.json`, then `encode` / `decode` / `StreamDecoder` of random text and ids,
//! and `ChatTemplate::new` + `render` of random Jinja with random messages.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use model::{ChatMessage, ChatTemplate, GenerationConfig, ModelConfig, Tokenizer};
use serde_json::{json, Value};

use super::harness::{self, mutate_bytes, mutate_json, random_json, Case, Fuzz, TempDir};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hf/qwen2-4layer")
        .join(name)
}

/// Random text: ASCII, multi-byte characters, special-token spellings, controls, Jinja syntax.
fn random_text(fz: &mut Fuzz) -> String {
    const PIECES: [&str; 16] = [
        "hello",
        " ",
        "\n",
        "\t",
        "ü",
        "水",
        "🙂",
        "<|im_start|>",
        "<|im_end|>",
        "<|endoftext|>",
        "{{ 1 }}",
        "{% endfor %}",
        "\u{0}",
        "\u{FFFD}",
        "'s",
        "\u{200d}",
    ];
    let n = fz.below(24);
    let mut s = String::new();
    for _ in 0..n {
        match fz.below(4) {
            0 => {
                let n = 1 + fz.below(6);
                s.push_str(&String::from_utf8_lossy(&fz.bytes(n)));
            }
            1 => s.push(char::from_u32(fz.below(0x11000) as u32).unwrap_or('x')),
            _ => s.push_str(fz.pick::<&str>(&PIECES)),
        }
    }
    if fz.chance(3) {
        s = s.repeat(1 + fz.below(200));
    }
    s
}

/// Random token ids: in the vocabulary, just past it, or anywhere.
fn random_ids(fz: &mut Fuzz, vocab: usize) -> Vec<u32> {
    (0..fz.below(20))
        .map(|_| match fz.below(4) {
            0 => (vocab + fz.below(4)) as u32,
            1 => u32::MAX - fz.below(2) as u32,
            _ => fz.below(vocab.max(1)) as u32,
        })
        .collect()
}

fn random_messages(fz: &mut Fuzz) -> Vec<ChatMessage> {
    (0..fz.below(6))
        .map(|_| {
            let role = fz
                .pick(&["system", "user", "assistant", "tool", "", "<|im_end|>"])
                .to_string();
            ChatMessage::new(role, random_text(fz))
        })
        .collect()
}

/// Encodes, decodes and stream-decodes random inputs; every call is Ok or a tokenizer error.
fn exercise(tok: &Tokenizer, texts: &[String], ids: &[Vec<u32>]) -> Result<(), String> {
    let vocab = tok.vocab_size();
    let typed = |e: model::ModelError| -> Result<(), String> {
        match e.kind() {
            "tokenizer" if !e.to_string().contains('\n') => Ok(()),
            _ => Err(format!("unexpected error {}: {e}", e.kind())),
        }
    };
    for text in texts {
        for special in [false, true] {
            match tok.encode(text, special) {
                Ok(ids) => {
                    if let Err(e) = tok.decode(&ids, special) {
                        typed(e)?;
                    }
                }
                Err(e) => typed(e)?,
            }
        }
        let _ = tok.token_to_id(text);
    }
    for ids in ids {
        for skip in [false, true] {
            if let Err(e) = tok.decode(ids, skip) {
                typed(e)?;
            }
        }
        let mut stream = tok.stream();
        for &id in ids {
            if let Err(e) = stream.push(id) {
                typed(e)?;
            }
        }
        if let Err(e) = stream.finish() {
            typed(e)?;
        }
    }
    let _ = vocab;
    Ok(())
}

/// Structural damage that tokenizers has to refuse or survive.
fn mutate_tokenizer_json(fz: &mut Fuzz, v: &mut Value) {
    let edits: [(&str, Value); 12] = [
        (
            "truncation",
            json!({"direction": "Right", "max_length": 0, "strategy": "LongestFirst", "stride": 5}),
        ),
        (
            "truncation",
            json!({"direction": "Left", "max_length": 1, "strategy": "OnlySecond", "stride": 0}),
        ),
        (
            "padding",
            json!({"strategy": {"Fixed": 0}, "direction": "Left", "pad_to_multiple_of": 0, "pad_id": 4294967295u64, "pad_type_id": 0, "pad_token": "<nope>"}),
        ),
        (
            "padding",
            json!({"strategy": "BatchLongest", "direction": "Right", "pad_to_multiple_of": 3, "pad_id": 0, "pad_type_id": 0, "pad_token": ""}),
        ),
        (
            "added_tokens",
            json!([{"id": 4294967295u64, "content": "<|x|>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}]),
        ),
        (
            "added_tokens",
            json!([{"id": 5, "content": "", "single_word": true, "lstrip": true, "rstrip": true, "normalized": true, "special": false}]),
        ),
        (
            "post_processor",
            json!({"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}], "pair": [], "special_tokens": {}}),
        ),
        (
            "post_processor",
            json!({"type": "RobertaProcessing", "sep": ["</s>", 4294967295u64], "cls": ["<s>", 0], "trim_offsets": true, "add_prefix_space": true}),
        ),
        (
            "pre_tokenizer",
            json!({"type": "Split", "pattern": {"Regex": "(a*)*b|(?<=x)"}, "behavior": "Isolated", "invert": false}),
        ),
        (
            "normalizer",
            json!({"type": "Replace", "pattern": {"String": ""}, "content": "xx"}),
        ),
        (
            "decoder",
            json!({"type": "Strip", "content": " ", "start": 4294967295u64, "stop": 0}),
        ),
        (
            "model",
            json!({"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##", "max_input_chars_per_word": 0, "vocab": {"a": 0, "b": 4294967295u64}}),
        ),
    ];
    match fz.below(5) {
        0 | 1 => {
            let (key, value) = fz.pick(&edits).clone();
            v[key] = value;
        }
        2 => {
            // Vocabulary and merges that disagree.
            let model = &mut v["model"];
            match fz.below(3) {
                0 => model["merges"] = json!([["zz", "qq"], ["a"], "x y z"]),
                1 => {
                    model["vocab"]["Ġ"] =
                        json!(*fz.pick(&[json!(u32::MAX), json!(-1), json!(99999), json!(0)]))
                }
                _ => model["unk_token"] = json!(*fz.pick(&["<nope>", "", "a"])),
            }
        }
        _ => mutate_json(
            fz,
            v,
            &[
                "model",
                "vocab",
                "merges",
                "added_tokens",
                "normalizer",
                "pre_tokenizer",
                "post_processor",
                "decoder",
                "truncation",
                "padding",
                "type",
                "id",
                "content",
            ],
        ),
    }
}

/// Random Jinja: mostly well-formed blocks built from pieces of real templates (loops, ifs,
/// namespaces, macros, filters and method calls), with a few broken fragments and, rarely, a
/// loop bomb that only the fuel stops.
fn random_template(fz: &mut Fuzz) -> String {
    let mut out = String::new();
    block(fz, 3, &mut out);
    out
}

fn block(fz: &mut Fuzz, depth: usize, out: &mut String) {
    const TEXT: [&str; 6] = [
        "<|im_start|>",
        "<|im_end|>\n",
        "\n",
        "system",
        " ",
        "{{ '\n' }}",
    ];
    const EXPR: [&str; 18] = [
        "message['content']",
        "message.role",
        "bos_token",
        "eos_token",
        "messages[0]['content']",
        "messages[-1].content.split('<')[0] | trim",
        "messages | length",
        "messages | tojson",
        "message['content'].startswith('a')",
        "'ab' * 1000",
        "'x' * 1000000000000",
        "undefined_thing.attr",
        "1 / 0",
        "loop.index0",
        "ns.s",
        "raise_exception('bad role')",
        "message.content | replace('a', 'bb')",
        "(messages | map(attribute='role') | list)[1:]",
    ];
    const COND: [&str; 6] = [
        "add_generation_prompt",
        "loop.first and message['role'] != 'system'",
        "message.role == 'user'",
        "messages | length > 2",
        "not ns.s",
        "message.content is string",
    ];
    const ITER: [&str; 6] = [
        "messages",
        "messages[::-1]",
        "range(3)",
        "range(1000000000)",
        "message.content",
        "messages[1:]",
    ];
    const BROKEN: [&str; 6] = [
        "{{",
        "{% for",
        "{# unclosed",
        "{% endfor %}",
        "{% else %}",
        "{% raw %}{{ x }}",
    ];
    for _ in 0..1 + fz.below(4) {
        match fz.below(if depth == 0 { 3 } else { 10 }) {
            0 => out.push_str(fz.pick::<&str>(&TEXT)),
            1 | 2 => out.push_str(&format!("{{{{ {} }}}}", fz.pick(&EXPR))),
            3 | 4 => {
                out.push_str(&format!("{{% for message in {} %}}", fz.pick(&ITER)));
                block(fz, depth - 1, out);
                out.push_str("{% endfor %}");
            }
            5 | 6 => {
                out.push_str(&format!("{{% if {} %}}", fz.pick(&COND)));
                block(fz, depth - 1, out);
                if fz.chance(40) {
                    out.push_str("{% else %}");
                    block(fz, depth - 1, out);
                }
                out.push_str("{% endif %}");
            }
            7 => out.push_str(fz.pick::<&str>(&[
                "{% set ns = namespace(s='') %}",
                "{% set ns.s = ns.s ~ message['content'] %}",
                "{% macro m(n) %}{{ m(n + 1) }}{% endmacro %}{{ m(0) }}",
                "{% if loop.index0 > 1 %}{% break %}{% endif %}",
            ])),
            8 if fz.chance(3) => out.push_str(fz.pick::<&str>(&[
                "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
                "{% for i in range(100000) %}{% for m in messages %}{{ m.content }}{% endfor %}{% endfor %}",
            ])),
            8 if fz.chance(50) => out.push_str(fz.pick::<&str>(&BROKEN)),
            _ => out.push_str(fz.pick::<&str>(&TEXT)),
        }
    }
}

/// One render must end within this, long loops included (the fuel bounds them).
const RENDER_LIMIT: Duration = Duration::from_secs(20);

/// Whether `t` rendered; a failure to render must be a one-line chat-template error.
fn render_checked(t: &ChatTemplate, messages: &[ChatMessage], add: bool) -> Result<bool, String> {
    let start = Instant::now();
    let result = t.render(messages, add);
    if start.elapsed() > RENDER_LIMIT {
        return Err(format!("render took {:?}", start.elapsed()));
    }
    match result {
        Ok(text) if text.len() <= ChatTemplate::MAX_OUTPUT => Ok(true),
        Ok(text) => Err(format!("{} bytes of output", text.len())),
        Err(e) if e.kind() == "chat-template" && !e.to_string().contains('\n') => Ok(false),
        Err(e) => Err(format!("unexpected error {}: {e}", e.kind())),
    }
}

#[test]
fn random_chat_templates_compile_and_render_within_bounds_or_fail_typed() {
    harness::run("chat-template", 6, 600, |fz, _| {
        let source = random_template(fz);
        let messages = random_messages(fz);
        let (bos, eos) = (random_text(fz), random_text(fz));
        let input = format!("template {source:?}; messages {messages:?}");
        Case::new(input, move || {
            match ChatTemplate::new(&source, &bos, &eos) {
                // A template that fails (or runs out of fuel) once is not rendered again.
                Ok(t) => {
                    if render_checked(&t, &messages, false)? {
                        render_checked(&t, &messages, true)?;
                    }
                    Ok(())
                }
                Err(e) if e.kind() == "chat-template" && !e.to_string().contains('\n') => Ok(()),
                Err(e) => Err(format!("unexpected error {}: {e}", e.kind())),
            }
        })
    });
}

#[test]
fn mutated_tokenizer_files_load_or_fail_typed_and_encode_decode_never_panic() {
    let tokenizer_json: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("tokenizer.json")).unwrap()).unwrap();
    let tokenizer_config: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("tokenizer_config.json")).unwrap())
            .unwrap();
    let config = Arc::new(ModelConfig::from_dir(&fixture("")).unwrap());
    let scratch = Arc::new(TempDir::new("tokenizer"));
    harness::run("tokenizer", 7, 300, |fz, seed| {
        // tokenizer.json: structurally mutated, byte-mutated, or left alone.
        let mut tok_bytes = match fz.below(4) {
            0 => {
                let mut bytes = serde_json::to_vec(&tokenizer_json).unwrap();
                mutate_bytes(fz, &mut bytes);
                bytes
            }
            1 => serde_json::to_vec(&tokenizer_json).unwrap(),
            _ => {
                let mut v = tokenizer_json.clone();
                mutate_tokenizer_json(fz, &mut v);
                serde_json::to_vec(&v).unwrap()
            }
        };
        if fz.chance(5) {
            let at = fz.below(tok_bytes.len());
            tok_bytes.truncate(at);
        }
        // tokenizer_config.json: special tokens and chat template of every odd shape.
        let mut tc = tokenizer_config.clone();
        match fz.below(5) {
            0 => tc["chat_template"] = json!(random_template(fz)),
            1 => {
                tc["chat_template"] =
                    json!([{"name": "default", "template": random_template(fz)}, {"name": 5}, "x"])
            }
            2 => tc[*fz.pick(&["bos_token", "eos_token"])] = random_json(fz, 2),
            3 => mutate_json(
                fz,
                &mut tc,
                &["chat_template", "bos_token", "eos_token", "content"],
            ),
            _ => {}
        }
        let tc_bytes = if fz.chance(5) {
            b"{\"chat_template\": \"{% for".to_vec()
        } else {
            serde_json::to_vec(&tc).unwrap()
        };
        let texts: Vec<String> = (0..4).map(|_| random_text(fz)).collect();
        let ids: Vec<Vec<u32>> = (0..3).map(|_| random_ids(fz, 1024)).collect();
        let messages = random_messages(fz);
        let input = format!(
            "tokenizer.json {}; tokenizer_config.json {}",
            harness::show_bytes(&tok_bytes[..tok_bytes.len().min(300)]),
            String::from_utf8_lossy(&tc_bytes)
        );
        let (scratch, config) = (scratch.clone(), config.clone());
        Case::new(input, move || {
            let dir = scratch.path().join(seed.to_string());
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("tokenizer.json"), &tok_bytes).unwrap();
            std::fs::write(dir.join("tokenizer_config.json"), &tc_bytes).unwrap();
            let loaded = Tokenizer::from_dir(&dir, &config, &GenerationConfig::default());
            let _ = std::fs::remove_dir_all(&dir);
            let tok = match loaded {
                Ok(tok) => tok,
                Err(e)
                    if matches!(e.kind(), "tokenizer" | "json" | "chat-template")
                        && !e.to_string().contains('\n') =>
                {
                    return Ok(())
                }
                Err(e) => return Err(format!("unexpected error {}: {e}", e.kind())),
            };
            exercise(&tok, &texts, &ids)?;
            if let Some(t) = tok.chat_template() {
                render_checked(t, &messages, true)?;
            }
            Ok(())
        })
    });
}

/// Fixed inputs: loops that would run for hours and output that would grow without end are
/// errors once the template has spent its fuel or output budget.
#[test]
fn endless_loops_and_huge_output_in_a_chat_template_are_errors() {
    let cases = [
        "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
        "{% for i in range(100000) %}{% for m in messages %}{{ m.content }}{% endfor %}{% endfor %}",
        "{% for i in range(1000) %}{{ 'x' * 99999999 }}{% endfor %}",
    ];
    for (i, source) in cases.into_iter().enumerate() {
        let input = source.to_string();
        harness::run_case(
            "chat-template-fixed",
            i as u64,
            Case::new(input, move || {
                let t = ChatTemplate::new(source, "", "").map_err(|e| e.to_string())?;
                let messages = vec![ChatMessage::user("a".repeat(1000)); 4];
                match t.render(&messages, true) {
                    Err(e) if e.kind() == "chat-template" => Ok(()),
                    r => Err(format!("rendered: {:?}", r.map(|s| s.len()))),
                }
            }),
        );
    }
}

/// Fixed inputs: a `TemplateProcessing` post-processor that names a special token it does not
/// define, or a second sequence in its single-sequence template, loads in the tokenizers crate
/// and then panicked inside `encode` (found by the fuzzer, seed 7000060).
#[test]
fn post_processors_that_panic_in_the_tokenizers_crate_are_encode_errors() {
    let processors = [
        json!({"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}], "pair": [], "special_tokens": {}}),
        json!({"type": "TemplateProcessing", "single": [{"Sequence": {"id": "B", "type_id": 0}}], "pair": [], "special_tokens": {}}),
    ];
    let base: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("tokenizer.json")).unwrap()).unwrap();
    let config = Arc::new(ModelConfig::from_dir(&fixture("")).unwrap());
    for (i, processor) in processors.into_iter().enumerate() {
        let mut tokenizer = base.clone();
        tokenizer["post_processor"] = processor;
        let input = tokenizer["post_processor"].to_string();
        let config = config.clone();
        harness::run_case(
            "post-processor-fixed",
            i as u64,
            Case::new(input, move || {
                let dir = TempDir::new("post-processor");
                std::fs::write(dir.path().join("tokenizer.json"), tokenizer.to_string()).unwrap();
                let tok = Tokenizer::from_dir(dir.path(), &config, &GenerationConfig::default())
                    .map_err(|e| format!("load: {e}"))?;
                match tok.encode("hello", true) {
                    Err(e) if e.kind() == "tokenizer" && !e.to_string().contains('\n') => Ok(()),
                    r => Err(format!("encode: {r:?}")),
                }
            }),
        );
    }
}
