//! `hob serve`'s input from the network and from the model: a request body through `json_object`,
//! `chat_request` and `completion_request` (the forced tool call's prefix and grammar and the
//! response_format schema compiled as the worker compiles them), and a model's answer streamed
//! through `ToolSplitter` and parsed as tool calls in each format.
//!
//! Input: parts separated by NUL bytes: the request body, the model's answer, and the sizes of the
//! pieces the answer streams in.
#![no_main]

use std::sync::OnceLock;

use hob::generate::{Constraint, Grammars};
use hob::serve::api::{chat_request, completion_request, json_object, Request};
use hob::serve::tools::{ToolFormat, ToolSplitter};
use hob_fuzz::{parts, pieces};
use libfuzzer_sys::fuzz_target;

const FORMATS: [ToolFormat; 3] = [ToolFormat::Hermes, ToolFormat::Mistral, ToolFormat::Harmony];

/// The tiny Mixtral's vocabulary (512 tokens, EOS 2): grammars compile against it.
fn grammars() -> Option<&'static Grammars> {
    static G: OnceLock<Option<Grammars>> = OnceLock::new();
    G.get_or_init(|| {
        let json = include_str!("../../fixtures/tiny-mixtral/tokenizer.json");
        Grammars::new(json, 512, 2).ok()
    })
    .as_ref()
}

fuzz_target!(|data: &[u8]| {
    let parts = parts(data);
    if let Ok(body) = json_object(parts[0]) {
        for request in [chat_request(&body), completion_request(&body)] {
            match request {
                Ok(r) => walk_request(&r),
                Err(e) => drop(std::hint::black_box(e.body())),
            }
        }
    }
    let answer = parts
        .get(1)
        .map(|p| String::from_utf8_lossy(p))
        .unwrap_or_default();
    let sizes = parts.get(2).copied().unwrap_or(&[]);
    for format in FORMATS {
        let _ = format.parse(&answer);
        for prefix in [String::new(), format.marker().to_string()] {
            let mut split = ToolSplitter::new(format, prefix);
            let mut content = String::new();
            for piece in pieces(&answer, sizes) {
                content.push_str(&split.push(piece));
            }
            let (held, calls) = split.finish();
            if calls {
                let _ = format.parse(&held);
            }
        }
    }
});

fn walk_request(r: &Request) {
    std::hint::black_box(format!("{r:?}"));
    let Some(g) = grammars() else { return };
    if let Some(schema) = &r.format {
        if let Ok(c) = g.json_schema(schema.clone()) {
            walk_constraint(c);
        }
    }
    if let Some((tools, choice)) = &r.tools {
        for format in FORMATS {
            std::hint::black_box(format.forced_prefix(choice));
            if let Some(grammar) = format.forced_grammar(choice, tools) {
                if let Ok(c) = g.lark(&grammar) {
                    walk_constraint(c);
                }
            }
        }
    }
}

/// A few steps of masked decoding, always taking the first allowed token.
fn walk_constraint(mut c: Constraint) {
    let mut logits = vec![0f32; 512];
    for _ in 0..4 {
        logits.fill(0.0);
        if c.mask(&mut logits).is_err() {
            return;
        }
        let Some(id) = logits.iter().position(|l| l.is_finite()) else {
            return;
        };
        if c.accept(id as u32).is_err() {
            return;
        }
    }
}
