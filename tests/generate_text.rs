//! Tokenizer, chat templates and streaming detokenization against Mistral's real tokenizer.json
//! and chat template (tests/fixtures/mistral, see NOTICE there); the expected ids are
//! mistral-common's (Mistral's own SentencePiece-based encoder), not ours.

use std::str::FromStr;

use hob::generate::{
    ChatTemplate, Conversation, GenerateError, Message, RenderDelta, StreamDecoder, Tokenizer,
    TEMPLATE_FUEL, TEMPLATE_MAX_OUTPUT,
};

const TOKENIZER_JSON: &str = include_str!("fixtures/mistral/tokenizer.json");
const MIXTRAL_TEMPLATE: &str = include_str!("fixtures/mistral/chat_template.jinja");

/// SmolLM2-Instruct's chat_template (tokenizer_config.json / GGUF tokenizer.chat_template).
const SMOLLM2_TEMPLATE: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// mistral-common v1 for user "What is the capital of France?" / assistant "Paris." /
/// user "And of Italy?".
const FRANCE_ITALY_IDS: [u32; 29] = [
    1, 733, 16289, 28793, 1824, 349, 272, 5565, 302, 4843, 28804, 733, 28748, 16289, 28793, 5465,
    28723, 2, 733, 16289, 28793, 1015, 302, 10828, 28804, 733, 28748, 16289, 28793,
];

fn mistral() -> Tokenizer {
    Tokenizer::from_json(TOKENIZER_JSON, 1, 2, true).expect("load the Mistral tokenizer")
}

fn france_italy() -> Vec<Message> {
    vec![
        Message::user("What is the capital of France?"),
        Message::assistant("Paris."),
        Message::user("And of Italy?"),
    ]
}

#[test]
fn mistral_encodes_like_mistral_common() {
    let tok = mistral();
    let text = "Hello world! The quick brown fox jumps over the lazy dog.";
    let expected = [
        22557, 1526, 28808, 415, 2936, 9060, 285, 1142, 461, 10575, 754, 272, 17898, 3914, 28723,
    ];
    assert_eq!(tok.encode(text, false).unwrap(), expected);
    let mut with_bos = vec![1];
    with_bos.extend(expected);
    assert_eq!(tok.encode(text, true).unwrap(), with_bos);
    assert_eq!(tok.decode(&with_bos, true).unwrap(), text);
    assert_eq!(tok.vocab_size(), 32000);
    assert_eq!(tok.token_to_id("</s>").unwrap(), 2);
    assert!(tok.is_eos(2) && !tok.is_eos(1));
}

#[test]
fn mixtral_template_renders_mistral_v1_text() {
    let template = ChatTemplate::new(MIXTRAL_TEMPLATE, "<s>", "</s>").unwrap();
    let text = template.render(&france_italy(), true).unwrap();
    // The v1 template writes a space before each [INST] and before the answer; the space after
    // <s> and </s> is the one SentencePiece would have put there as the dummy prefix.
    assert_eq!(
        text,
        "<s> [INST] What is the capital of France? [/INST] Paris.</s> [INST] And of Italy? [/INST]"
    );
}

#[test]
fn mixtral_chat_ids_equal_mistral_common() {
    let tok = mistral();
    let template = ChatTemplate::new(MIXTRAL_TEMPLATE, "<s>", "</s>").unwrap();
    let text = template.render(&france_italy(), true).unwrap();
    // add_special = false: the template writes <s> itself, as apply_chat_template(tokenize=True)
    // encodes with add_special_tokens=False.
    assert_eq!(tok.encode(&text, false).unwrap(), FRANCE_ITALY_IDS);
}

/// Why Tokenizer splits at special tokens itself: this legacy tokenizer.json, used as is (what
/// the tokenizers library and so transformers' apply_chat_template do with it), prepends "▁" to
/// each stretch after a special token, so " [INST]" becomes "▁▁[INST]": an extra "▁" (28705)
/// after <s> and after </s> that mistral-common never produces.
#[test]
fn legacy_file_as_is_adds_spurious_space_tokens() {
    let raw = tokenizers::Tokenizer::from_str(TOKENIZER_JSON).unwrap();
    let template = ChatTemplate::new(MIXTRAL_TEMPLATE, "<s>", "</s>").unwrap();
    let text = template.render(&france_italy(), true).unwrap();
    let ids = raw.encode(text.as_str(), false).unwrap().get_ids().to_vec();
    let mut expected = FRANCE_ITALY_IDS.to_vec();
    expected.insert(18, 28705); // after </s>
    expected.insert(1, 28705); // after <s>
    assert_eq!(ids, expected);
}

#[test]
fn conversation_delta_continues_the_cache_exactly() {
    let tok = mistral();
    let template = ChatTemplate::new(MIXTRAL_TEMPLATE, "<s>", "</s>").unwrap();
    let mut chat = Conversation::new();
    chat.push(Message::user("What is the capital of France?"));
    let RenderDelta::Append(first) = chat.render_delta(&template, true).unwrap() else {
        panic!("the first render must append to the empty text");
    };
    let mut ids = tok.encode(&first, false).unwrap();
    chat.push(Message::assistant("Paris."));
    chat.push(Message::user("And of Italy?"));
    let RenderDelta::Append(second) = chat.render_delta(&template, true).unwrap() else {
        panic!("the v1 template only appends");
    };
    assert_eq!(second, " Paris.</s> [INST] And of Italy? [/INST]");
    ids.extend(tok.encode_continuation(&second).unwrap());
    assert_eq!(ids, FRANCE_ITALY_IDS);
    // Starting as a new text would have put SentencePiece's dummy prefix before " Paris.".
    assert_ne!(tok.encode(&second, false).unwrap(), FRANCE_ITALY_IDS[15..]);
}

#[test]
fn conversation_reports_a_rewritten_prefix() {
    // A template that rewrites earlier text as messages arrive (here: a message count up front).
    let template = ChatTemplate::new(
        "{{ messages | length }}:{% for m in messages %}[{{ m.content }}]{% endfor %}",
        "",
        "",
    )
    .unwrap();
    let mut chat = Conversation::new();
    chat.push(Message::user("a"));
    assert_eq!(
        chat.render_delta(&template, true).unwrap(),
        RenderDelta::Append("1:[a]".into())
    );
    chat.push(Message::user("b"));
    assert_eq!(
        chat.render_delta(&template, true).unwrap(),
        RenderDelta::Rerender("2:[a][b]".into())
    );
    assert_eq!(chat.rendered(), "2:[a][b]");
    assert_eq!(
        chat.render_delta(&template, true).unwrap(),
        RenderDelta::Append(String::new())
    );
}

#[test]
fn mixtral_template_refuses_unordered_roles() {
    let template = ChatTemplate::new(MIXTRAL_TEMPLATE, "<s>", "</s>").unwrap();
    let err = template
        .render(&[Message::assistant("Hi"), Message::user("Hello")], true)
        .unwrap_err();
    assert!(matches!(err, GenerateError::TemplateRender { .. }));
    assert!(
        err.to_string()
            .contains("conversation roles must alternate user/assistant"),
        "{err}"
    );
}

#[test]
fn chatml_renders_system_and_user_turns() {
    let template = ChatTemplate::new(SMOLLM2_TEMPLATE, "<|im_start|>", "<|im_end|>").unwrap();
    let text = template
        .render(
            &[Message::system("You are terse."), Message::user("Hi!")],
            true,
        )
        .unwrap();
    assert_eq!(
        text,
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"
    );
    let default_system = template.render(&[Message::user("Hi!")], false).unwrap();
    assert_eq!(
        default_system,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
    );
}

#[test]
fn template_helpers_match_transformers() {
    let source =
        "{{ messages[0]['content'].strip() }}|{{ messages[0]['content'].startswith(' <') }}|\
                  {{ messages | tojson }}|{{ messages[0] | tojson(indent=2) }}";
    let template = ChatTemplate::new(source, "", "").unwrap();
    let text = template
        .render(&[Message::user(" <b>é\"x\" ")], false)
        .unwrap();
    // As Jinja2 prints a bool (True), and Python's json.dumps(x, ensure_ascii=False): ", " / ": "
    // separators, no HTML escaping, keys in the order of the dict transformers passes.
    assert_eq!(
        text,
        "<b>é\"x\"|True|[{\"role\": \"user\", \"content\": \" <b>é\\\"x\\\" \"}]|\
         {\n  \"role\": \"user\",\n  \"content\": \" <b>é\\\"x\\\" \"\n}"
    );
    let syntax = ChatTemplate::new("{% if %}", "", "").err().unwrap();
    assert!(
        matches!(syntax, GenerateError::TemplateSyntax { .. }),
        "{syntax}"
    );
}

#[test]
fn template_trims_block_lines_like_transformers() {
    // trim_blocks + lstrip_blocks, and no trailing newline from the file's last line.
    let source = "{% for m in messages %}\n    {% if true %}\n[{{ m.content }}]\n    {% endif %}\n{% endfor %}\n";
    let template = ChatTemplate::new(source, "", "").unwrap();
    let text = template
        .render(&[Message::user("a"), Message::user("b")], false)
        .unwrap();
    assert_eq!(text, "[a]\n[b]\n");
}

fn assert_streams_like_decode(tok: &Tokenizer, ids: &[u32], skip_special: bool) {
    let mut stream = StreamDecoder::new(tok, skip_special);
    let mut streamed = String::new();
    let mut chunks = Vec::new();
    for &id in ids {
        let chunk = stream.push(id).unwrap();
        assert!(
            !chunk.contains('\u{FFFD}'),
            "broken UTF-8 in chunk {chunk:?}"
        );
        streamed.push_str(&chunk);
        chunks.push(chunk);
    }
    streamed.push_str(&stream.flush().unwrap());
    assert_eq!(
        streamed,
        tok.decode(ids, skip_special).unwrap(),
        "chunks: {chunks:?}"
    );
}

#[test]
fn stream_decode_holds_back_partial_utf8() {
    let tok = mistral();
    let text = "Café au lait, 日本語のテキスト 🦀🎉 and naïve émigrés.";
    let ids = tok.encode(text, false).unwrap();
    let byte_tokens = ids
        .iter()
        .filter(|&&id| tok.id_to_token(id).is_some_and(|t| t.starts_with("<0x")))
        .count();
    assert!(byte_tokens >= 4, "the text must need byte-fallback tokens");
    assert_streams_like_decode(&tok, &ids, false);
    assert_eq!(tok.decode(&ids, false).unwrap(), text);

    // As generated after a chat prompt: the answer ends with EOS, which is not printed.
    let mut answer = tok.encode("Le café est très bon 😀.", false).unwrap();
    answer.push(2);
    assert_streams_like_decode(&tok, &answer, true);
}

#[test]
fn stream_decode_keeps_sentencepiece_spaces() {
    let tok = mistral();
    let ids = tok.encode("The quick brown fox", false).unwrap();
    let mut stream = StreamDecoder::new(&tok, true);
    let chunks: Vec<String> = ids.iter().map(|&id| stream.push(id).unwrap()).collect();
    // "fox" is "▁f" + "ox" in this vocabulary.
    assert_eq!(chunks, ["The", " quick", " brown", " f", "ox"]);
    assert_eq!(stream.flush().unwrap(), "");
}

#[test]
fn stream_flush_prints_a_cut_off_character() {
    let tok = mistral();
    // "日" is <0xE6><0x97><0xA5>: stop after two of its three bytes.
    let e6 = tok.token_to_id("<0xE6>").unwrap();
    let x97 = tok.token_to_id("<0x97>").unwrap();
    let mut stream = StreamDecoder::new(&tok, false);
    assert_eq!(stream.push(tok.token_to_id("▁A").unwrap()).unwrap(), "A");
    assert_eq!(stream.push(e6).unwrap(), "");
    assert_eq!(stream.push(x97).unwrap(), "");
    // Byte fallback decodes each byte of an incomplete character to U+FFFD.
    assert_eq!(stream.flush().unwrap(), "\u{FFFD}\u{FFFD}");
    assert_eq!(stream.flush().unwrap(), "");
}

#[test]
fn tokenizer_errors_name_the_problem() {
    let bad = Tokenizer::from_json("{\"model\": 3}", 1, 2, true)
        .err()
        .unwrap();
    assert!(
        bad.to_string()
            .starts_with("not a Hugging Face tokenizer: "),
        "{bad}"
    );
    let out_of_range = Tokenizer::from_json(TOKENIZER_JSON, 1, 40000, true)
        .err()
        .unwrap();
    assert_eq!(
        out_of_range.to_string(),
        "tokenizer: eos_id = 40000 is outside the vocabulary (size 32000)"
    );
    let tok = mistral();
    let unknown = tok.token_to_id("<|im_end|>").unwrap_err();
    assert_eq!(
        unknown.to_string(),
        "tokenizer: token \"<|im_end|>\" is not in the vocabulary"
    );
    assert!(tok.decode(&[1, 99999], false).is_err());
}

/// Issue 49, item 3: a syntax error inside "decoder" made the tokenizers crate panic.
#[test]
fn tokenizer_json_with_a_syntax_error_in_its_decoder_is_an_error_not_a_panic() {
    let decoder = "\"decoder\": {\n    \"type\": \"Sequence\",";
    assert!(TOKENIZER_JSON.contains(decoder));
    // serde_json reports the missing comma where the next key starts, two lines below "decoder".
    let decoder_line = TOKENIZER_JSON[..TOKENIZER_JSON.find(decoder).unwrap()]
        .matches('\n')
        .count()
        + 1;
    let broken = TOKENIZER_JSON.replacen(decoder, "\"decoder\": {\n    \"type\": \"Sequence\"", 1);
    let err = Tokenizer::from_json(&broken, 1, 2, true).err().unwrap();
    assert!(matches!(err, GenerateError::TokenizerLoad { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.starts_with("not a Hugging Face tokenizer: invalid JSON: ")
            && text.contains(&format!("at line {} column", decoder_line + 2)),
        "{text}"
    );
    // Valid JSON the crate refuses: its own error, no panic either.
    let unknown = TOKENIZER_JSON.replacen(
        decoder,
        "\"decoder\": {\n    \"type\": \"NoSuchDecoder\",",
        1,
    );
    let err = Tokenizer::from_json(&unknown, 1, 2, true).err().unwrap();
    assert!(
        err.to_string()
            .starts_with("not a Hugging Face tokenizer: "),
        "{err}"
    );
    assert!(hob::generate::parse_hf_json(&broken).is_err());
    assert!(hob::generate::parse_hf_json("[1, 2]").is_err());
}

/// Issue 49, item 4: nested range(100000) loops rendered forever.
#[test]
fn template_with_nested_huge_loops_stops_with_a_budget_error() {
    let source = "{% for i in range(100000) %}\n{% for j in range(100000) %}{{ j }}{% endfor %}\n{% endfor %}";
    let template = ChatTemplate::new(source, "", "").unwrap();
    let started = std::time::Instant::now();
    let err = template.render(&[Message::user("hi")], true).unwrap_err();
    assert!(
        matches!(err, GenerateError::TemplateTooMuchWork { .. }),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        format!(
            "chat template: too much work (more than {TEMPLATE_FUEL} steps): stopped at line 2 of the template"
        )
    );
    assert!(started.elapsed().as_secs() < 30, "{:?}", started.elapsed());
}

/// Issue 49, item 4: a template could print gigabytes (here 10 GB) before failing.
#[test]
fn template_with_gigantic_output_is_bounded() {
    let template = ChatTemplate::new(
        "{% for i in range(100000) %}{{ 'x' * 100000 }}{% endfor %}",
        "",
        "",
    )
    .unwrap();
    let err = template.render(&[], false).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("chat template: the prompt would be longer than {TEMPLATE_MAX_OUTPUT} bytes")
    );
    // One huge string is refused before it is made, by the budget.
    let template = ChatTemplate::new("{{ 'x' * 10000000000 }}", "", "").unwrap();
    let err = template.render(&[], false).unwrap_err();
    assert!(
        matches!(err, GenerateError::TemplateTooMuchWork { .. }),
        "{err}"
    );
}

/// Issue 49, item 4: "chat template: syntax error: syntax error: ..." said it twice; render errors
/// said "invalid operation: " before the template's own message.
#[test]
fn template_errors_say_what_went_wrong_once() {
    let syntax = ChatTemplate::new("{{ 1 }}\n{% if %}", "", "")
        .err()
        .unwrap();
    assert_eq!(
        syntax.to_string(),
        "chat template: syntax error: unexpected end of block at line 2"
    );
    let template = ChatTemplate::new(MIXTRAL_TEMPLATE, "<s>", "</s>").unwrap();
    let refused = template
        .render(&[Message::assistant("x")], true)
        .unwrap_err();
    let text = refused.to_string();
    assert!(
        text.starts_with("chat template: cannot render the conversation: After the optional")
            && text.ends_with("at line 11"),
        "{text}"
    );
    let template = ChatTemplate::new("{{ nope(1) }}", "", "").unwrap();
    assert_eq!(
        template.render(&[], false).unwrap_err().to_string(),
        "chat template: cannot render the conversation: unknown function: nope is unknown at line 1"
    );
}
