//! What several benches share.

/// `bytes` bytes of f16 weights alternating 1.0 and -1.0 (values do not matter for speed; the
/// alternation keeps sums from growing).
pub fn f16_weights(bytes: usize) -> Vec<u8> {
    (0..bytes / 2)
        .flat_map(|i| {
            if i % 2 == 0 {
                [0x00, 0x3c]
            } else {
                [0x00, 0xbc]
            }
        })
        .collect()
}
