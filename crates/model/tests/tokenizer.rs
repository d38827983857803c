//! Tokenizer round trips, chat templates, streaming detokenization.

mod common;

use model::{ChatMessage, ChatTemplate, GenerationConfig, ModelConfig, Tokenizer};

fn demo_tokenizer(dir: &common::TempDir) -> Tokenizer {
    let config = ModelConfig::from_dir(dir.path()).unwrap();
    let gen = GenerationConfig::from_dir(dir.path()).unwrap();
    Tokenizer::from_dir(dir.path(), &config, &gen).unwrap()
}

const TEXTS: [&str; 6] = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.\n\n  indented line\ttab",
    "Grüße aus München: ça coûte 5 € — naïve café.",
    "水是生命之源。日本語のテキスト。한국어 🙂🎉 ❤️",
    "fn main() { println!(\"{}\", 1 + 2); }",
    "<|im_start|>user\nhi<|im_end|>\n",
];

#[test]
fn round_trip_on_the_demo_tokenizer() {
    let dir = common::demo_model();
    let tok = demo_tokenizer(&dir);
    for text in TEXTS {
        let ids = tok.encode(text, false).unwrap();
        assert!(!ids.is_empty());
        assert!(ids.iter().all(|&i| (i as usize) < tok.vocab_size()));
        assert_eq!(tok.decode(&ids, false).unwrap(), text, "{ids:?}");
    }
    // Special tokens are single ids and are hidden when asked.
    let ids = tok.encode(TEXTS[5], false).unwrap();
    assert_eq!(ids[0], tok.token_to_id("<|im_start|>").unwrap());
    assert_eq!(tok.decode(&ids, true).unwrap(), "user\nhi\n");
    // Frequent words of the corpus are single tokens: the BPE really trained.
    assert!(tok.encode(" the", false).unwrap().len() == 1);
    assert!(tok.encode("Hello, world!", false).unwrap().len() < "Hello, world!".len());
}

#[test]
fn chat_template_of_the_demo_model() {
    let dir = common::demo_model();
    let tok = demo_tokenizer(&dir);
    assert!(tok.has_chat_template());
    let text = tok
        .apply_chat_template(
            &[
                ChatMessage::system("Be brief."),
                ChatMessage::user("Hi"),
                ChatMessage::assistant("Hello!"),
                ChatMessage::user("Bye"),
            ],
            true,
        )
        .unwrap();
    assert_eq!(
        text,
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"
    );
    let no_prompt = tok
        .apply_chat_template(&[ChatMessage::user("Hi")], false)
        .unwrap();
    assert!(
        no_prompt.ends_with("<|im_start|>user\nHi<|im_end|>\n"),
        "{no_prompt:?}"
    );
}

/// Written in the style of DeepSeek-R1-Distill-Qwen's template: `namespace`, `is none`,
/// `'x' in s`, `.split(...)[-1]`, `{%- -%}` trimming, `bos_token`.
const R1_STYLE: &str = "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}{% set ns = namespace(is_first=false, is_tool=false, system_prompt='') %}{%- for message in messages %}{%- if message['role'] == 'system' %}{% set ns.system_prompt = message['content'] %}{%- endif %}{%- endfor %}{{bos_token}}{{ns.system_prompt}}{%- for message in messages %}{%- if message['role'] == 'user' %}{%- set ns.is_tool = false -%}{{'<｜User｜>' + message['content']}}{%- endif %}{%- if message['role'] == 'assistant' and message['content'] is not none %}{% set content = message['content'] %}{% if '</think>' in content %}{% set content = content.split('</think>')[-1] %}{% endif %}{{'<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>'}}{%- endif %}{%- endfor -%}{% if add_generation_prompt and not ns.is_tool %}{{'<｜Assistant｜><think>\\n'}}{% endif %}";

#[test]
fn r1_distill_style_template() {
    let t =
        ChatTemplate::new(R1_STYLE, "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>").unwrap();
    let out = t
        .render(
            &[
                ChatMessage::system("SYS"),
                ChatMessage::user("2+2?"),
                ChatMessage::assistant("<think>\nadd\n</think>4"),
                ChatMessage::user("3+3?"),
            ],
            true,
        )
        .unwrap();
    assert_eq!(
        out,
        "<｜begin▁of▁sentence｜>SYS<｜User｜>2+2?<｜Assistant｜>4<｜end▁of▁sentence｜><｜User｜>3+3?<｜Assistant｜><think>\n"
    );
}

/// Qwen2.5-style: loop.last / loop.index0 lookups, string methods, trim_blocks + lstrip_blocks
/// whitespace control as transformers sets it, `raise_exception`, `tojson`, loop controls.
#[test]
fn qwen_style_template_features() {
    let src = "{%- if messages[0]['role'] == 'system' %}\n    {{- '<|im_start|>system\\n' + messages[0]['content'].strip() + '<|im_end|>\\n' }}\n{%- else %}\n    {{- '<|im_start|>system\\nDefault.<|im_end|>\\n' }}\n{%- endif %}\n{%- for message in messages %}\n    {%- if message.role == 'tool' %}{{ raise_exception('tools are not supported') }}{% endif %}\n    {%- if message.role == 'system' %}{% continue %}{% endif %}\n    {{- '<|im_start|>' + message.role + '\\n' + message.content | trim + '<|im_end|>' + '\\n' }}\n    {%- if loop.last and message.role == 'user' and message.content.startswith('STOP') %}{% break %}{% endif %}\n{%- endfor %}\n{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n{%- endif %}\n{{- {'k': 'v'} | tojson if false else '' }}";
    let t = ChatTemplate::new(src, "", "<|im_end|>").unwrap();
    let out = t
        .render(
            &[
                ChatMessage::system("  Be nice. "),
                ChatMessage::user(" Hi "),
            ],
            true,
        )
        .unwrap();
    assert_eq!(
        out,
        "<|im_start|>system\nBe nice.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
    let out = t.render(&[ChatMessage::user("Hello")], false).unwrap();
    assert_eq!(
        out,
        "<|im_start|>system\nDefault.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
    );
    // raise_exception surfaces as a one-line chat-template error with the message.
    let err = t
        .render(&[ChatMessage::new("tool", "x")], true)
        .unwrap_err();
    assert_eq!(err.kind(), "chat-template");
    assert!(err.to_string().contains("tools are not supported"), "{err}");
    assert!(!err.to_string().contains('\n'), "{err}");
    // tojson is available.
    let t = ChatTemplate::new("{{ messages | tojson }}", "", "").unwrap();
    let out = t.render(&[ChatMessage::user("a\"b")], false).unwrap();
    let back: Vec<ChatMessage> = serde_json::from_str(&out).unwrap();
    assert_eq!(back, vec![ChatMessage::user("a\"b")]);
}

#[test]
fn broken_or_missing_templates_are_errors() {
    let err = ChatTemplate::new("{% for m in messages %}", "", "").unwrap_err();
    assert_eq!(err.kind(), "chat-template");
    // A tokenizer without a template refuses chat rendering.
    let dir = common::demo_model();
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("tokenizer_config.json")).unwrap())
            .unwrap();
    cfg.as_object_mut().unwrap().remove("chat_template");
    std::fs::write(dir.join("tokenizer_config.json"), cfg.to_string()).unwrap();
    let tok = demo_tokenizer(&dir);
    assert!(!tok.has_chat_template());
    let err = tok
        .apply_chat_template(&[ChatMessage::user("x")], true)
        .unwrap_err();
    assert!(err.to_string().contains("no chat template"), "{err}");
    // transformers 5 keeps it in chat_template.jinja.
    std::fs::write(
        dir.join("chat_template.jinja"),
        "{% for m in messages %}[{{ m.content }}]{% endfor %}",
    )
    .unwrap();
    let tok = demo_tokenizer(&dir);
    assert_eq!(
        tok.apply_chat_template(&[ChatMessage::user("x")], true)
            .unwrap(),
        "[x]"
    );
    // A missing tokenizer.json is a clear error.
    std::fs::remove_file(dir.join("tokenizer.json")).unwrap();
    let config = ModelConfig::from_dir(dir.path()).unwrap();
    let err = Tokenizer::from_dir(dir.path(), &config, &GenerationConfig::default()).unwrap_err();
    assert!(err.to_string().contains("tokenizer.json"), "{err}");
}

#[test]
fn eos_ids_are_collected_from_every_source() {
    let dir = common::demo_model();
    let tok = demo_tokenizer(&dir);
    let im_end = tok.token_to_id("<|im_end|>").unwrap();
    let eot = tok.token_to_id("<|endoftext|>").unwrap();
    assert_eq!(tok.eos_token_ids(), &[im_end, eot]);
    assert_eq!(tok.bos_token_id(), Some(eot));
    // Without generation_config.json: config.json's eos plus tokenizer_config's eos_token.
    std::fs::remove_file(dir.join("generation_config.json")).unwrap();
    let tok = demo_tokenizer(&dir);
    assert_eq!(tok.eos_token_ids(), &[im_end]);
}

/// Streams `ids` through the detokenizer, returning the pieces.
fn stream(tok: &Tokenizer, ids: &[u32]) -> Vec<String> {
    let mut d = tok.stream();
    let mut pieces = Vec::new();
    for &id in ids {
        if let Some(p) = d.push(id).unwrap() {
            pieces.push(p);
        }
    }
    if let Some(p) = d.finish().unwrap() {
        pieces.push(p);
    }
    pieces
}

#[test]
fn streaming_never_splits_a_character() {
    let dir = common::demo_model();
    let tok = demo_tokenizer(&dir);
    for text in TEXTS.iter().take(5) {
        let ids = tok.encode(text, false).unwrap();
        let pieces = stream(&tok, &ids);
        for p in &pieces {
            assert!(!p.contains('\u{FFFD}'), "{text:?}: piece {p:?}");
        }
        assert_eq!(pieces.concat(), *text);
    }
    // The case this exists for: a character whose bytes are split across tokens.
    let text = "水🙂";
    let ids = tok.encode(text, false).unwrap();
    assert!(ids.len() > 2, "expected byte-level pieces, got {ids:?}");
    let split = ids
        .iter()
        .any(|&id| tok.decode(&[id], false).unwrap().contains('\u{FFFD}'));
    assert!(
        split,
        "no token of {ids:?} is a partial character: the test would not test anything"
    );
    let pieces = stream(&tok, &ids);
    assert_eq!(pieces, vec!["水".to_string(), "🙂".to_string()]);
}

#[test]
fn streaming_emits_a_dangling_partial_character_only_at_the_end() {
    let dir = common::demo_model();
    let tok = demo_tokenizer(&dir);
    let ids = tok.encode("a🙂", false).unwrap();
    // Drop the last byte-token: the emoji can never complete.
    let cut = &ids[..ids.len() - 1];
    let mut d = tok.stream();
    let mut during = String::new();
    for &id in cut {
        if let Some(p) = d.push(id).unwrap() {
            during.push_str(&p);
        }
    }
    assert_eq!(during, "a");
    let tail = d.finish().unwrap().unwrap();
    assert!(tail.contains('\u{FFFD}'), "{tail:?}");
    // Ids outside the vocabulary (models pad their embeddings) are skipped, not an error.
    let mut d = tok.stream();
    assert_eq!(d.push(5000).unwrap(), None);
    assert_eq!(d.finish().unwrap(), None);
}
