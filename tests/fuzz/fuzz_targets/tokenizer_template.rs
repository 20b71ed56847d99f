//! A checkpoint's tokenizer files as `hob convert` reads them (`TokenizerFiles::open`), the
//! tokenizer as `hob run` loads it from the .hob metadata (`Tokenizer::from_json`), and the chat
//! template rendered over hostile messages (`ChatTemplate`, `Conversation`), the prompt encoded
//! and decoded back, token by token too.
//!
//! Input: parts separated by NUL bytes: tokenizer.json, tokenizer_config.json,
//! chat_template.jinja, generation_config.json (each written only when not empty), the template
//! variables (a JSON object), then one part per message: role, content and optionally the
//! message's tool_calls JSON, separated by 0x01 bytes. Messages past the first `MESSAGES` are
//! ignored: each message re-renders the conversation so far, and inputs of hundreds of empty
//! parts made executions quadratic (13 a second) without reaching new code.
#![no_main]

use hob::generate::{ChatTemplate, Conversation, Message, StreamDecoder, Tokenizer};
use hob::import::TokenizerFiles;
use hob_fuzz::{parts, scratch_dir, scratch_file, scratch_remove};
use libfuzzer_sys::fuzz_target;

const FILES: [&str; 4] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "generation_config.json",
];

const MESSAGES: usize = 4;

fuzz_target!(|data: &[u8]| {
    let parts = parts(data);
    for (i, name) in FILES.iter().enumerate() {
        match parts.get(i) {
            Some(p) if !p.is_empty() => drop(scratch_file(name, p)),
            _ => scratch_remove(name),
        }
    }
    let files = TokenizerFiles::open(scratch_dir(), (Some(1), Some(2))).ok();
    let tok = files.as_ref().and_then(|f| {
        let tok = Tokenizer::from_json(&f.json, f.bos_id, f.eos_id.unwrap_or(0), f.add_bos);
        let mut tok = tok.ok()?;
        for &id in &f.stop_ids {
            let _ = tok.add_stop_id(id);
        }
        let _ = tok.add_stop_token("</s>");
        Some(tok)
    });
    let text = |i: usize| {
        parts
            .get(i)
            .map(|p| String::from_utf8_lossy(p).into_owned())
    };
    let source = match files.as_ref().and_then(|f| f.chat_template.clone()) {
        Some(t) => t,
        None => text(2).unwrap_or_default(),
    };
    let kwargs = match serde_json::from_str(&text(4).unwrap_or_default()) {
        Ok(serde_json::Value::Object(m)) => m,
        _ => serde_json::Map::new(),
    };
    let messages: Vec<Message> = parts
        .iter()
        .skip(5)
        .take(MESSAGES)
        .map(|p| message(p))
        .collect();
    let name = |id: Option<u32>, or: &str| {
        id.and_then(|i| tok.as_ref()?.id_to_token(i))
            .unwrap_or_else(|| or.to_string())
    };
    let (bos, eos) = match &files {
        Some(f) => (name(f.bos_id, "<s>"), name(f.eos_id, "</s>")),
        None => ("<s>".to_string(), "</s>".to_string()),
    };
    if let Ok(mut template) = ChatTemplate::new(&source, &bos, &eos) {
        for (k, v) in &kwargs {
            let _ = template.set_var(k, v);
        }
        let mut prompts = Vec::new();
        prompts.extend(template.render_with(&messages, true, &kwargs).ok());
        prompts.extend(template.render(&messages, false).ok());
        let mut chat = Conversation::new();
        for m in &messages {
            chat.push(m.clone());
            prompts.extend(
                chat.render_delta(&template, true)
                    .ok()
                    .map(|d| format!("{d:?}")),
            );
        }
        if let Some(tok) = &tok {
            for p in &prompts {
                walk_text(tok, p);
            }
        }
    }
    if let Some(tok) = &tok {
        for m in &messages {
            walk_text(tok, &m.content);
        }
    }
});

/// "role\x01content[\x01tool_calls]".
fn message(part: &[u8]) -> Message {
    let text = String::from_utf8_lossy(part);
    let mut fields = text.splitn(3, '\x01');
    let (role, content) = match (fields.next(), fields.next()) {
        (Some(r), Some(c)) => (r, c),
        (Some(c), None) => ("user", c),
        _ => ("user", ""),
    };
    let mut m = Message::new(role, content);
    if let Some(calls) = fields.next() {
        let v = serde_json::from_str(calls).unwrap_or(serde_json::Value::String(calls.into()));
        m.extra.push(("tool_calls".into(), v));
    }
    m
}

/// Encode, decode back, and stream the ids through the incremental decoder.
fn walk_text(tok: &Tokenizer, text: &str) {
    let Ok(ids) = tok.encode(text, true) else {
        return;
    };
    let _ = tok.encode_continuation(text);
    let _ = tok.decode(&ids, false);
    let _ = tok.decode(&ids, true);
    let mut stream = StreamDecoder::new(tok, false);
    for &id in &ids {
        let _ = stream.push(id);
        std::hint::black_box(tok.is_eos(id));
    }
    let _ = stream.flush();
    // Ids past the vocabulary, as a corrupt model could produce.
    let past = tok.vocab_size() as u32;
    let _ = tok.decode(&[past, u32::MAX], false);
    let _ = StreamDecoder::new(tok, true).push(past);
}
