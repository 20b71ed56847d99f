//! Streaming detokenization: print each sampled token's text as soon as it is complete UTF-8.
//!
//! Decoding tokens one by one is wrong twice: a SentencePiece token loses its leading "▁" space
//! when decoded alone (the decoder strips the text's first space), and a character split over
//! byte-fallback tokens (`<0xE6><0x97><0xA5>`) or byte-level BPE tokens decodes to U+FFFD until its
//! last byte arrives. So a window of ids is decoded with the token before the new ones as context,
//! and only the text beyond that context is emitted, once it no longer ends in U+FFFD.
//! (tokenizers' own `DecodeStream` does the same but has no flush for a cut-off character.)

use super::{GenerateError, Tokenizer};

pub struct StreamDecoder<'t> {
    tokenizer: &'t Tokenizer,
    skip_special: bool,
    /// ids[..read] are printed; ids[..read] decoded gives the context that the next chunk is cut
    /// from. Ids before the context are dropped as the stream advances.
    ids: Vec<u32>,
    read: usize,
}

impl<'t> StreamDecoder<'t> {
    /// `skip_special`: leave special tokens (EOS, chat markers) out of the printed text.
    pub fn new(tokenizer: &'t Tokenizer, skip_special: bool) -> Self {
        StreamDecoder {
            tokenizer,
            skip_special,
            ids: Vec::with_capacity(16),
            read: 0,
        }
    }

    /// Take the next sampled id; returns the text that is now complete (often empty while a
    /// multi-byte character is still arriving).
    pub fn push(&mut self, id: u32) -> Result<String, GenerateError> {
        self.ids.push(id);
        let context = self
            .tokenizer
            .decode(&self.ids[..self.read], self.skip_special)?;
        let text = self.tokenizer.decode(&self.ids, self.skip_special)?;
        if text.ends_with('\u{FFFD}') {
            return Ok(String::new());
        }
        let new = beyond(&context, &text).to_owned();
        // Keep the last printed token as context for the leading-space rule.
        let keep_from = self.ids.len() - 1;
        self.ids.drain(..keep_from);
        self.read = self.ids.len();
        Ok(new)
    }

    /// End of generation: whatever is held back (an incomplete character prints as U+FFFD).
    pub fn flush(&mut self) -> Result<String, GenerateError> {
        let context = self
            .tokenizer
            .decode(&self.ids[..self.read], self.skip_special)?;
        let text = self.tokenizer.decode(&self.ids, self.skip_special)?;
        let new = beyond(&context, &text).to_owned();
        self.ids.clear();
        self.read = 0;
        Ok(new)
    }
}

/// The part of `text` after `context`. With SentencePiece and byte-level BPE the context decodes
/// the same with or without what follows, so it is a prefix; should a decoder ever rewrite it,
/// cutting at the longest common prefix prints nothing twice.
fn beyond<'a>(context: &str, text: &'a str) -> &'a str {
    if let Some(new) = text.strip_prefix(context) {
        return new;
    }
    let common = context
        .char_indices()
        .zip(text.chars())
        .find(|((_, a), b)| a != b)
        .map_or(context.len().min(text.len()), |((i, _), _)| i);
    &text[common..]
}
