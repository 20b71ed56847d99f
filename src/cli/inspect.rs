//! `hob inspect`: header, metadata, dense tensors and the expert table of a .hob file, as text or
//! one JSON object; `--verify` checks every checksum.

use super::out::outln;
use serde_json::{json, Value};

use super::InspectArgs;
use crate::experts::engine::kv_bytes;
use crate::format::{keys, HobFile, MetaValue};
use crate::model::ModelConfig;

/// Strings longer than this (the tokenizer JSON, the chat template) are shown abbreviated.
const MAX_SHOWN_CHARS: usize = 60;
/// Arrays longer than this are shown as their length only.
const MAX_SHOWN_ITEMS: usize = 16;

/// A metadata value as shown: long strings abbreviated to their start and length.
pub fn show_value(v: &MetaValue) -> Value {
    match v {
        MetaValue::U8(x) => json!(x),
        MetaValue::I8(x) => json!(x),
        MetaValue::U16(x) => json!(x),
        MetaValue::I16(x) => json!(x),
        MetaValue::U32(x) => json!(x),
        MetaValue::I32(x) => json!(x),
        MetaValue::U64(x) => json!(x),
        MetaValue::I64(x) => json!(x),
        // Through its shortest decimal form, so 1e-5f32 shows as 1e-5, not 9.99999974e-6.
        MetaValue::F32(x) => json!(x.to_string().parse::<f64>().unwrap_or(f64::from(*x))),
        MetaValue::F64(x) => json!(x),
        MetaValue::Bool(x) => json!(x),
        MetaValue::String(s) => {
            let n = s.chars().count();
            if n > MAX_SHOWN_CHARS {
                let head: String = s.chars().take(MAX_SHOWN_CHARS).collect();
                json!(format!("{head}... ({n} chars)"))
            } else {
                json!(s)
            }
        }
        MetaValue::Array { elem_type, items } => {
            if items.len() > MAX_SHOWN_ITEMS {
                json!(format!(
                    "[array of {} items, type {elem_type}]",
                    items.len()
                ))
            } else {
                Value::Array(items.iter().map(show_value).collect())
            }
        }
    }
}

/// Everything `inspect` shows, as one JSON object (the text form prints the same fields).
pub fn report(file: &HobFile) -> Value {
    let h = file.header();
    let metadata: serde_json::Map<String, Value> = file
        .metadata()
        .iter()
        .map(|(k, v)| (k.to_string(), show_value(v)))
        .collect();
    let tensors: Vec<Value> = file
        .tensors()
        .iter()
        .map(
            |t| json!({"name": t.name, "dtype": t.dtype.name(), "shape": t.shape, "bytes": t.size}),
        )
        .collect();
    let (hidden, ffn) = file.expert_dims();
    let (n_layers, n_experts) = (file.n_layers(), file.n_experts());
    let variants: Vec<Value> = file
        .variants()
        .iter()
        .enumerate()
        .map(|(vi, v)| {
            let mut bytes = 0u64;
            for l in 0..n_layers {
                for e in 0..n_experts {
                    bytes += file.expert_record(l, e, vi).size;
                }
            }
            json!({
                "variant": v.name(),
                "count": n_layers * n_experts,
                "bytes": bytes,
                "blob_bytes": file.expert_layout(vi).size,
                "bits_per_weight": v.bits_per_weight(ffn, hidden),
            })
        })
        .collect();
    let kv = ModelConfig::from_metadata(file.metadata()).map_or(Value::Null, |c| kv_cache(&c));
    json!({
        "file": file.path().display().to_string(),
        "header": {
            "version": h.version,
            "file_size": h.file_size,
            "sections": {
                "metadata": {"offset": h.metadata_offset, "bytes": h.metadata_len},
                "tensors": {"offset": h.tensors_offset, "bytes": h.tensors_len, "count": h.tensor_count},
                "experts": {"offset": h.experts_offset, "bytes": h.experts_len},
                "data": {"offset": h.data_offset, "bytes": h.data_len},
            },
        },
        "metadata": metadata,
        "tensors": tensors,
        "kv_cache": kv,
        "experts": {
            "layers": n_layers,
            "experts_per_layer": n_experts,
            "hidden": hidden,
            "ffn": ffn,
            "variants": variants,
            "source": match file.metadata().get(keys::SOURCE) {
                Some(MetaValue::String(s)) => json!(s),
                _ => Value::Null,
            },
        },
    })
}

/// What the model's KV cache holds a token (f16, as the engine sizes it: `kv_bytes`): MLA's
/// latent rows once, else keys and values; for MLA also what full keys and values would take.
fn kv_cache(c: &ModelConfig) -> Value {
    let per_token = kv_bytes(c, 1);
    let (form, full) = match c.mla {
        Some(m) => (
            format!(
                "MLA: latent {} + RoPE key {}, cached once",
                m.kv_lora, m.rope
            ),
            json!(c.n_layers * c.n_heads * (m.nope + m.rope + m.v) * 2),
        ),
        None => (
            format!(
                "{} KV heads x {}, keys and values",
                c.n_kv_heads, c.head_dim
            ),
            Value::Null,
        ),
    };
    json!({
        "bytes_per_token": per_token,
        "layers": c.n_layers,
        "form": form,
        "full_kv_bytes_per_token": full,
        "tokens_per_gib": (1usize << 30) / per_token.max(1),
    })
}

fn print_kv(kv: &Value) {
    let Some(b) = kv["bytes_per_token"].as_u64() else {
        return;
    };
    let full = match kv["full_kv_bytes_per_token"].as_u64() {
        Some(f) => format!(
            "; full keys and values {f} bytes, {:.1}x",
            f as f64 / b.max(1) as f64
        ),
        None => String::new(),
    };
    outln!(
        "KV cache (f16): {b} bytes a token over {} layers ({}{full}), {} tokens a GiB",
        kv["layers"],
        kv["form"].as_str().unwrap_or(""),
        kv["tokens_per_gib"]
    );
}

fn print_text(r: &Value) {
    let h = &r["header"];
    outln!(
        "{}: hob version {}, {} bytes",
        r["file"].as_str().unwrap_or(""),
        h["version"],
        h["file_size"]
    );
    if let Some(sections) = h["sections"].as_object() {
        for (name, s) in sections {
            outln!(
                "  {name:<9} offset {:>12}  {:>12} bytes",
                s["offset"],
                s["bytes"]
            );
        }
    }
    if let Some(m) = r["metadata"].as_object() {
        outln!("metadata ({} keys):", m.len());
        for (k, v) in m {
            outln!("  {k} = {v}");
        }
    }
    if let Some(ts) = r["tensors"].as_array() {
        outln!("dense tensors ({}):", ts.len());
        // The type column as wide as its longest entry ("f16", "int8/g64").
        let w = ts
            .iter()
            .filter_map(|t| t["dtype"].as_str())
            .map(str::len)
            .max()
            .unwrap_or(5)
            .max(5);
        for t in ts {
            outln!(
                "  {:<28} {:<w$} {:<14} {:>12} bytes",
                t["name"].as_str().unwrap_or(""),
                t["dtype"].as_str().unwrap_or(""),
                t["shape"].to_string(),
                t["bytes"]
            );
        }
    }
    print_kv(&r["kv_cache"]);
    let e = &r["experts"];
    outln!(
        "experts: {} layers x {} experts, hidden {}, ffn {}",
        e["layers"],
        e["experts_per_layer"],
        e["hidden"],
        e["ffn"]
    );
    if let Some(vs) = e["variants"].as_array() {
        for v in vs {
            outln!(
                "  {:<10} {:>6} blobs {:>14} bytes {:>8.3} bits/weight",
                v["variant"].as_str().unwrap_or(""),
                v["count"],
                v["bytes"],
                v["bits_per_weight"].as_f64().unwrap_or(0.0)
            );
        }
    }
    if let Some(src) = e["source"].as_str() {
        let mx = if src.contains("MXFP4") {
            "; mxfp4 the file's MXFP4 blocks as they are"
        } else {
            ""
        };
        outln!("  made from {src} (float variants converted, integer ones quantized by hob{mx})");
    }
}

pub fn run(args: &InspectArgs) -> crate::Result<()> {
    let file = HobFile::open(&args.file)?;
    let mut r = report(&file);
    let verified = if args.verify {
        file.verify().map_err(|e| e.in_file(&args.file))?;
        let n = file.tensors().len() + file.n_layers() * file.n_experts() * file.variants().len();
        r["verify"] = json!({"ok": true, "checksums": n});
        Some(n)
    } else {
        None
    };
    let entropy = args.entropy.then(|| super::entropy::report(&file));
    if let Some(e) = &entropy {
        r["entropy"] = json!(e);
    }
    if args.json {
        outln!("{r}");
        if let Some(n) = verified {
            eprintln!("verify: all {n} checksums OK");
        }
    } else {
        print_text(&r);
        if let Some(e) = &entropy {
            super::entropy::print(e);
        }
        if let Some(n) = verified {
            outln!("verify: all {n} checksums OK");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_strings_and_arrays_are_abbreviated() {
        let long = "é".repeat(100);
        let shown = show_value(&MetaValue::String(long));
        assert_eq!(shown, json!(format!("{}... (100 chars)", "é".repeat(60))));
        assert_eq!(
            show_value(&MetaValue::String("mixtral".into())),
            json!("mixtral")
        );
        let items = vec![MetaValue::U32(1); 20];
        assert_eq!(
            show_value(&MetaValue::Array {
                elem_type: 4,
                items
            }),
            json!("[array of 20 items, type 4]")
        );
        assert_eq!(show_value(&MetaValue::F32(0.5)), json!(0.5));
        assert_eq!(show_value(&MetaValue::F32(1e-5)), json!(1e-5));
    }
}
