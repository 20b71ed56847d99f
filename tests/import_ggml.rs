//! GGML dequantization against gguf-py's numpy `quants.dequantize` (tests/fixtures/ggml-blocks,
//! made by tools/make_ggml_fixture.py), and the errors that name a bad type or row.
//!
//! Every type is compared bit for bit. gguf-py computes in the same order as ggml's C: f16 scales
//! widened to f32 (exact), sub-block scales as f32 products (d * sc, dmin * m), then x = scale * q
//! (- min or + m), each operation rounded to f32 and none fused; hob's decoders do the same, so no
//! type needs a tolerance. The F16 and BF16 rows include zeros of both signs, subnormals,
//! infinities and quiet NaNs (payload kept), still compared by bits.

use std::path::PathBuf;

use hob::import::ggml::{dequantize_row, GgmlType, SUPPORTED};

fn fixture(name: &str) -> (Vec<u8>, Vec<f32>) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ggml-blocks");
    let read = |ext: &str| {
        let path = dir.join(format!("{name}.{ext}"));
        std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    };
    let reference = read("f32")
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    (read("bin"), reference)
}

fn assert_matches_gguf_py(ty: GgmlType) {
    let (bytes, reference) = fixture(&ty.name().to_lowercase());
    assert_eq!(
        ty.row_bytes(reference.len()).unwrap(),
        bytes.len(),
        "{ty}: fixture sizes"
    );
    let mut out = vec![f32::NAN; reference.len()];
    dequantize_row(ty, &bytes, &mut out).unwrap();
    let mismatches: Vec<String> = out
        .iter()
        .zip(&reference)
        .enumerate()
        .filter(|(_, (a, b))| a.to_bits() != b.to_bits())
        .map(|(i, (a, b))| {
            format!(
                "[{i}] hob {a:e} ({:#010x}) gguf-py {b:e} ({:#010x})",
                a.to_bits(),
                b.to_bits()
            )
        })
        .collect();
    assert!(
        mismatches.is_empty(),
        "{ty}: {} of {} values differ from gguf-py, first: {:?}",
        mismatches.len(),
        out.len(),
        &mismatches[..mismatches.len().min(8)]
    );
}

macro_rules! bit_equal_to_gguf_py {
    ($($test:ident: $ty:ident,)*) => {
        $(
            #[test]
            fn $test() {
                assert_matches_gguf_py(GgmlType::$ty);
            }
        )*
    };
}

bit_equal_to_gguf_py! {
    f16_bit_equal_to_gguf_py: F16,
    bf16_bit_equal_to_gguf_py: BF16,
    q4_0_bit_equal_to_gguf_py: Q4_0,
    q4_1_bit_equal_to_gguf_py: Q4_1,
    q5_0_bit_equal_to_gguf_py: Q5_0,
    q5_1_bit_equal_to_gguf_py: Q5_1,
    q8_0_bit_equal_to_gguf_py: Q8_0,
    q2_k_bit_equal_to_gguf_py: Q2_K,
    q3_k_bit_equal_to_gguf_py: Q3_K,
    q4_k_bit_equal_to_gguf_py: Q4_K,
    q5_k_bit_equal_to_gguf_py: Q5_K,
    q6_k_bit_equal_to_gguf_py: Q6_K,
    mxfp4_bit_equal_to_gguf_py: MXFP4,
}

#[test]
fn every_supported_type_but_f32_has_a_fixture() {
    for &ty in SUPPORTED {
        if ty != GgmlType::F32 {
            fixture(&ty.name().to_lowercase());
        }
    }
}

#[test]
fn wrong_row_length_names_type_and_sizes() {
    let (bytes, reference) = fixture("q4_k");
    let mut out = vec![0.0f32; reference.len()];
    let err = dequantize_row(GgmlType::Q4_K, &bytes[1..], &mut out)
        .unwrap_err()
        .to_string();
    assert_eq!(err, "a Q4_K row of 1024 values takes 576 bytes, found 575");

    let mut short = vec![0.0f32; 100];
    let err = dequantize_row(GgmlType::Q8_0, &[0; 34], &mut short)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("Q8_0") && err.contains("100") && err.contains("32"),
        "{err}"
    );
}

#[test]
fn unsupported_types_are_named_not_panics() {
    let iq2 = GgmlType::from_code(16).unwrap();
    assert_eq!(iq2, GgmlType::IQ2_XXS);
    let mut out = vec![0.0f32; 256];
    let err = dequantize_row(iq2, &[0; 66], &mut out)
        .unwrap_err()
        .to_string();
    assert!(err.contains("IQ2_XXS") && err.contains("code 16"), "{err}");
    assert!(err.contains("Q4_K"), "lists what is supported: {err}");

    let err = GgmlType::from_code(99).unwrap_err().to_string();
    assert!(err.contains("99"), "{err}");
    // Codes ggml retired (Q4_2 = 4, Q4_0_4_4 = 31) are unknown too.
    assert!(GgmlType::from_code(4).is_err() && GgmlType::from_code(31).is_err());

    for &ty in GgmlType::ALL {
        let n = ty.block_size();
        let mut out = vec![0.0f32; n];
        let result = dequantize_row(ty, &vec![0; ty.type_size()], &mut out);
        assert_eq!(result.is_ok(), SUPPORTED.contains(&ty), "{ty}: {result:?}");
    }
}

#[test]
fn row_bytes_rejects_partial_blocks() {
    assert_eq!(GgmlType::Q6_K.row_bytes(512).unwrap(), 420);
    assert_eq!(GgmlType::BF16.row_bytes(3).unwrap(), 6);
    let err = GgmlType::Q4_0.row_bytes(48).unwrap_err().to_string();
    assert_eq!(
        err,
        "a Q4_0 row of 48 values is not a whole number of 32-value blocks"
    );
    // 4 bytes a value: a row this long overflows usize.
    let err = GgmlType::F32.row_bytes(usize::MAX).unwrap_err().to_string();
    assert!(err.contains("F32"), "{err}");
}
