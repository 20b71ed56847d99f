//! `hob convert`: Hugging Face checkpoint (or GGUF file) -> .hob, streamed one tensor or one expert at a time
//! so peak memory stays near two experts (one read ahead; all its variants) plus the largest dense tensor.

use super::out::outln;
use std::io::{IsTerminal, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use rayon::prelude::*;

use super::ConvertArgs;
use crate::error::Error;
use crate::format::{writer, DenseSpec, ExpertLayout, HobWriter, TensorType, Variant, VariantKind};
use crate::import::synthetic::{self, SyntheticModel};
use crate::import::{dtype, Checkpoint, ConvertSource, DensePlan, ExpertWeights, GgufCheckpoint};
use crate::quant::{self, ErrorStats};

/// Parse `--experts`: comma-separated variant names, no duplicates.
pub fn parse_variants(list: &str, group_size: Option<u32>) -> crate::Result<Vec<Variant>> {
    let mut out: Vec<Variant> = Vec::new();
    for name in list.split(',').map(str::trim) {
        let v = Variant::parse(name, group_size)
            .map_err(|e| Error::Invalid(format!("--experts: {e}")))?;
        if v.is_view() {
            return Err(Error::Invalid(format!(
                "--experts {name}: a width is how ap8 is read (--expert-variant {name}); \
                 store ap8 and every width 2..=8 can be read from it"
            )));
        }
        if out.contains(&v) {
            return Err(Error::Invalid(format!(
                "--experts: variant '{v}' is listed twice"
            )));
        }
        out.push(v);
    }
    Ok(out)
}

/// Parse `--dense` (absent: every matrix in the source's dtype).
pub fn parse_dense(s: Option<&str>, group: Option<u32>) -> crate::Result<DensePlan> {
    s.map_or(Ok(DensePlan::default()), |s| {
        DensePlan::parse(s, group).map_err(Error::Invalid)
    })
}

/// One dense tensor's bytes as `spec` stores it (packed matrices quantized).
fn encode_dense(spec: &DenseSpec, values: &[f32]) -> crate::Result<Vec<u8>> {
    match spec.dtype {
        TensorType::Float(d) => Ok(dtype::encode(d, values)),
        TensorType::Packed(v) => {
            let [rows, cols] = spec.shape[..] else {
                return Err(Error::Invalid(format!("{}: {v} needs a matrix", spec.name)));
            };
            let layout = v
                .matrix_layout(rows, cols)
                .map_err(|e| Error::Invalid(format!("--dense: {}: {e}", spec.name)))?;
            Ok(quant::quantize_matrix(v, &layout, values))
        }
    }
}

/// Quantize one expert into `variant`'s blob (`layout.size` bytes) and measure its error.
pub fn quantize_expert(
    variant: Variant,
    layout: &ExpertLayout,
    w: &ExpertWeights,
) -> (Vec<u8>, ErrorStats) {
    if variant.kind == VariantKind::Ap8 {
        return ap8_expert(variant, layout, w);
    }
    let mut blob = vec![0u8; layout.size];
    let mut stats = ErrorStats::default();
    let raw = w
        .mxfp4
        .as_deref()
        .filter(|_| variant.kind == VariantKind::Mxfp4);
    for (i, (offset, m, src)) in [
        (layout.gate_offset, &layout.gate, &w.gate),
        (layout.up_offset, &layout.up, &w.up),
        (layout.down_offset, &layout.down, &w.down),
    ]
    .into_iter()
    .enumerate()
    {
        let dst = &mut blob[offset..offset + m.size];
        // MXFP4 sources keep their codes and exponents (the values are the same either way).
        if raw.and_then(|r| r[i].store(m, dst)).is_none() {
            dst.copy_from_slice(&quant::quantize_matrix(variant, m, src));
        }
        stats.add(&quant::measure_error(variant, m, dst, src));
    }
    (blob, stats)
}

/// An ap8 blob and its error at width 8 (the parent: every narrower view reads fewer bits).
fn ap8_expert(variant: Variant, layout: &ExpertLayout, w: &ExpertWeights) -> (Vec<u8>, ErrorStats) {
    let (hidden, ffn) = (layout.gate.cols, layout.gate.rows);
    let blob = quant::quantize_ap8_expert(hidden, ffn, [&w.gate, &w.up, &w.down]);
    let mut stats = ErrorStats::default();
    for (part, (m, src)) in [
        (&layout.gate, &w.gate),
        (&layout.up, &w.up),
        (&layout.down, &w.down),
    ]
    .into_iter()
    .enumerate()
    {
        let view = crate::format::MatrixView {
            part: part as u8,
            ..m.view(variant, &blob)
        };
        stats.add(&quant::measure_view(quant::Matrix::from_view(view), src));
    }
    (blob, stats)
}

/// Checks on `-o` before any work is done: a file name (not a directory), in a directory that
/// exists.
fn check_output(out: &Path) -> crate::Result<()> {
    let shown = out.display();
    let names_a_dir = out.as_os_str().as_bytes().ends_with(b"/") || out.file_name().is_none();
    if names_a_dir || out.is_dir() {
        return Err(Error::Invalid(format!(
            "-o {shown}: names a directory; give the path of the .hob file to write (e.g. {})",
            out.join("model.hob").display()
        )));
    }
    let dir = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(Error::Invalid(format!(
            "output directory {} is not a directory",
            dir.display()
        ))),
        Err(e) => Err(Error::io(dir, "output directory", e)),
    }
}

/// Everything done before reading the source: check `-o`, make Ctrl-C and SIGTERM remove the
/// temporary file, and remove temporary files of earlier converts that were killed.
fn prepare_output(out: &Path) -> crate::Result<()> {
    check_output(out)?;
    install_interrupt_handler()?;
    for (path, pid) in writer::remove_stale_temp_files(out)? {
        eprintln!(
            "hob convert: removed {}, left by an interrupted convert (process {pid}, which is gone)",
            path.display()
        );
    }
    Ok(())
}

/// On SIGINT, SIGTERM or SIGHUP: remove the temporary .hob file being written, say so, and exit.
/// Installed once per process (a second convert in the same process keeps the first handler,
/// which serves every writer).
fn install_interrupt_handler() -> crate::Result<()> {
    static INSTALLED: OnceLock<Result<(), String>> = OnceLock::new();
    let installed = INSTALLED.get_or_init(|| {
        use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
        let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP])
            .map_err(|e| e.to_string())?;
        // A thread of its own waits for the signal, so the handler may remove files and print.
        std::thread::spawn(move || {
            let signal = signals.forever().next().unwrap_or(SIGINT);
            writer::remove_temp_files_then(|removed| {
                let removed = match removed {
                    [] => String::new(),
                    files => format!(
                        "; removed the unfinished output {}",
                        files
                            .iter()
                            .map(|p| p.display().to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                };
                // A progress bar may be on the current line.
                let newline = if std::io::stderr().is_terminal() {
                    "\n"
                } else {
                    ""
                };
                // Not eprintln!: with stderr gone it panics, and this thread would die before
                // exiting, leaving the convert running.
                let _ = writeln!(
                    std::io::stderr(),
                    "{newline}hob convert: interrupted{removed}"
                );
                // 128 + the signal, as a shell reports a process the signal ended.
                std::process::exit(128 + signal)
            })
        });
        Ok(())
    });
    installed.clone().map_err(|e| {
        Error::Invalid(format!(
            "convert: cannot install the interrupt handler: {e}"
        ))
    })
}

fn progress_bar(total: u64, enabled: bool) -> ProgressBar {
    if !enabled {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} ({eta}) {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar
}

struct VariantSummary {
    variant: Variant,
    count: usize,
    bytes: u64,
    bits_per_weight: f64,
    /// None for synthetic weights (nothing was quantized).
    error: Option<ErrorStats>,
}

pub fn run(args: &ConvertArgs) -> crate::Result<()> {
    let from = match (&args.from, &args.synthetic) {
        (None, Some(name)) => return run_synthetic(args, name),
        (Some(_), None) if args.layers.is_some() || args.seed.is_some() => {
            return Err(Error::Invalid(
                "convert: --layers and --seed go with --synthetic, not --from".into(),
            ))
        }
        (Some(from), None) => from,
        _ => {
            return Err(Error::Invalid(
                "convert: give exactly one of --from DIR and --synthetic MODEL".into(),
            ))
        }
    };
    let start = Instant::now();
    let group = args
        .group_size
        .or_else(|| is_gguf(from).then_some(GGUF_GROUP));
    // Flags are checked before the source is read; their defaults depend on the source.
    let experts = args
        .experts
        .as_deref()
        .map(|e| parse_variants(e, group))
        .transpose()?;
    let dense_plan = args
        .dense
        .as_deref()
        .map(|d| parse_dense(Some(d), group))
        .transpose()?;
    prepare_output(&args.output)?;
    let ckpt = open_source(from)?;
    let (variants, plan) = with_defaults(args, &*ckpt, group, (experts, dense_plan))?;
    let shape = ckpt.expert_shape();
    let layouts = variants
        .iter()
        .map(|v| v.expert_layout(shape.hidden, shape.ffn))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Error::Invalid(format!("--experts: {e}")))?;
    let dense = ckpt.dense_specs(&plan);
    let dense_bytes: u64 = dense
        .iter()
        .map(|d| d.dtype.size(&d.shape).map(|n| n as u64).map_err(|e| (d, e)))
        .sum::<Result<u64, _>>()
        .map_err(|(d, e)| Error::Invalid(format!("--dense: {} {:?}: {e}", d.name, d.shape)))?;
    let n_experts = shape.n_layers * shape.n_experts;
    let expert_bytes: u64 = layouts.iter().map(|l| (l.size * n_experts) as u64).sum();

    let mut writer = HobWriter::create(&args.output, &ckpt.metadata(), &dense, shape, &variants)?;
    let bar = progress_bar(
        dense_bytes + expert_bytes,
        !args.no_progress && std::io::stderr().is_terminal(),
    );

    for (i, (t, spec)) in ckpt.dense_tensors().iter().zip(&dense).enumerate() {
        bar.set_message(t.hob_name.clone());
        let bytes = encode_dense(spec, &ckpt.load_dense(t)?)?;
        writer.write_dense(i, &bytes)?;
        bar.inc(bytes.len() as u64);
    }

    let errors = write_experts(&*ckpt, (&variants, &layouts), &mut writer, &bar)?;
    writer.finish()?;
    bar.finish_and_clear();

    let size = std::fs::metadata(&args.output)
        .map_err(|e| Error::io(&args.output, "stat", e))?
        .len();
    let summaries: Vec<VariantSummary> = variants
        .iter()
        .zip(&layouts)
        .zip(errors)
        .map(|((v, l), error)| VariantSummary {
            variant: *v,
            count: n_experts,
            bytes: (l.size * n_experts) as u64,
            bits_per_weight: v.bits_per_weight(shape.ffn, shape.hidden),
            error: Some(error),
        })
        .collect();
    print_summary(
        &args.output,
        size,
        start.elapsed(),
        dense.len(),
        dense_bytes,
        &summaries,
    );
    if !ckpt.has_tokenizer() {
        outln!("no tokenizer in the source: the file runs on token ids, as synthetic files do");
    }
    Ok(())
}

/// Every expert quantized into each variant and written, layer by layer. A thread of its own
/// reads (and dequantizes) the next expert while this one is quantized and written, so that
/// reading, serial, overlaps the parallel quantization: at most two experts' f32 weights at once.
fn write_experts(
    ckpt: &dyn ConvertSource,
    (variants, layouts): (&[Variant], &[ExpertLayout]),
    writer: &mut HobWriter,
    bar: &ProgressBar,
) -> crate::Result<Vec<ErrorStats>> {
    let shape = ckpt.expert_shape();
    let mut errors = vec![ErrorStats::default(); variants.len()];
    let (tx, rx) = crossbeam_channel::bounded(0);
    std::thread::scope(|s| -> crate::Result<()> {
        // Dropped when this closure returns, early on an error too: the reader's send then
        // fails and it stops, so the scope's join does not wait on it.
        let rx = rx;
        s.spawn(move || {
            for (layer, expert) in
                (0..shape.n_layers).flat_map(|l| (0..shape.n_experts).map(move |e| (l, e)))
            {
                let w = ckpt.load_expert(layer, expert);
                let failed = w.is_err();
                if tx.send((layer, expert, w)).is_err() || failed {
                    return;
                }
            }
        });
        for (layer, expert, w) in rx.iter() {
            let w = w?;
            bar.set_message(format!("layer {layer} expert {expert}"));
            // Each variant is computed independently, so the result does not depend on threads.
            let blobs: Vec<(Vec<u8>, ErrorStats)> = variants
                .par_iter()
                .zip(layouts)
                .map(|(v, l)| quantize_expert(*v, l, &w))
                .collect();
            for (vi, (blob, stats)) in blobs.iter().enumerate() {
                writer.write_expert(layer, expert, vi, blob)?;
                errors[vi].add(stats);
                bar.inc(blob.len() as u64);
            }
        }
        Ok(())
    })?;
    Ok(errors)
}

/// The flags' variants and dense plan (parsed before the source was read), else the source's
/// defaults; a GGUF's are printed (they follow its block types).
fn with_defaults(
    args: &ConvertArgs,
    ckpt: &dyn ConvertSource,
    group: Option<u32>,
    (experts, dense): (Option<Vec<Variant>>, Option<DensePlan>),
) -> crate::Result<(Vec<Variant>, DensePlan)> {
    let variants = match experts {
        Some(v) => v,
        None => parse_variants(ckpt.default_experts(), group)?,
    };
    let narrow = if dense.is_none() {
        ckpt.default_dense_int4()
    } else {
        Vec::new()
    };
    let n_narrow = narrow.len();
    let plan = match dense {
        Some(p) => p,
        None => parse_dense(ckpt.default_dense(), group)?.with_tensors(
            narrow,
            TensorType::parse("int4/g32", None).map_err(Error::Invalid)?,
        ),
    };
    let from_gguf = args.from.as_deref().is_some_and(is_gguf);
    if from_gguf && (args.experts.is_none() || args.dense.is_none()) {
        let also = if n_narrow > 0 {
            format!(" (int4/g32 for the {n_narrow} matrices in 4-bit blocks)")
        } else {
            String::new()
        };
        outln!(
            "from the GGUF's block types: --experts {} --dense {}{also}",
            args.experts.as_deref().unwrap_or(ckpt.default_experts()),
            args.dense
                .as_deref()
                .or(ckpt.default_dense())
                .unwrap_or(ckpt.source_dtype().name())
        );
    }
    Ok((variants, plan))
}

/// `--from`: a file whose name ends in `.gguf` or whose bytes start with GGUF's magic is read as
/// GGUF (the first file of a split set finds the others); anything else as a Hugging Face
/// checkpoint directory.
fn is_gguf(from: &Path) -> bool {
    if from.is_dir() {
        return false;
    }
    let named = from
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"));
    let mut magic = [0u8; 4];
    named
        || std::fs::File::open(from)
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
            .is_ok_and(|()| &magic == b"GGUF")
}

/// The group size of quantized variants from a GGUF that name none: its blocks (Q8_0, Q4_0,
/// Q5_0) and K-quant sub-blocks are 32 values, so int8/g32 holds a Q8_0 block exactly (its
/// scale and codes) and int4/g32 a Q4_K sub-block up to f16 rounding, in the file's bytes
/// (benches/results/2026-12-02-cpu-issue51-gguf-quality.md).
const GGUF_GROUP: u32 = 32;

fn open_source(from: &Path) -> crate::Result<Box<dyn ConvertSource>> {
    super::signals::guard_mapped(from);
    if is_gguf(from) {
        Ok(Box::new(GgufCheckpoint::open(from)?))
    } else {
        Ok(Box::new(Checkpoint::open(from)?))
    }
}

fn print_summary(
    out: &Path,
    size: u64,
    elapsed: Duration,
    n_dense: usize,
    dense_bytes: u64,
    variants: &[VariantSummary],
) {
    outln!(
        "wrote {} ({size} bytes, {:.1} MiB) in {:.2} s",
        out.display(),
        size as f64 / (1024.0 * 1024.0),
        elapsed.as_secs_f64()
    );
    outln!("dense: {n_dense} tensors, {dense_bytes} bytes");
    outln!(
        "{:<10} {:>8} {:>14} {:>12} {:>14}",
        "variant",
        "experts",
        "bytes",
        "bits/weight",
        "rel. RMS err"
    );
    for s in variants {
        let error = s
            .error
            .as_ref()
            .map_or_else(|| "-".to_string(), |e| format!("{:.6}", e.relative_rms()));
        outln!(
            "{:<10} {:>8} {:>14} {:>12.3} {:>14}",
            s.variant.name(),
            s.count,
            s.bytes,
            s.bits_per_weight,
            error
        );
    }
}

/// `convert --synthetic MODEL`: random weights in MODEL's shapes (import::synthetic).
fn run_synthetic(args: &ConvertArgs, name: &str) -> crate::Result<()> {
    let start = Instant::now();
    let mut model = SyntheticModel::preset(name).map_err(Error::Invalid)?;
    if let Some(n) = args.layers {
        model = model.with_layers(n).map_err(Error::Invalid)?;
    }
    if let Some(dir) = &args.tokenizer {
        model = model.with_tokenizer(dir)?;
    }
    let variants = parse_variants(
        args.experts.as_deref().unwrap_or("f16,int4"),
        args.group_size,
    )?;
    let dense = parse_dense(args.dense.as_deref(), args.group_size)?;
    let seed = args.seed.unwrap_or(0);
    prepare_output(&args.output)?;
    let bar = progress_bar(
        synthetic::payload_bytes(&model, &variants, &dense),
        !args.no_progress && std::io::stderr().is_terminal(),
    );
    let summary = synthetic::write(
        &model,
        &variants,
        &dense,
        seed,
        &args.output,
        &mut |what, n| {
            bar.set_message(what.to_string());
            bar.inc(n);
        },
    )?;
    bar.finish_and_clear();
    let elapsed = start.elapsed();
    let size = std::fs::metadata(&args.output)
        .map_err(|e| Error::io(&args.output, "stat", e))?
        .len();
    let shape = model.expert_shape();
    let summaries: Vec<VariantSummary> = summary
        .expert_bytes
        .iter()
        .map(|&(variant, bytes)| VariantSummary {
            variant,
            count: summary.experts_per_variant,
            bytes,
            bits_per_weight: variant.bits_per_weight(shape.ffn, shape.hidden),
            error: None,
        })
        .collect();
    outln!(
        "synthetic {}: {} of {} layers, seed {seed}; architecture {}, {}",
        model.name,
        model.spec.n_layers,
        model.total_layers,
        model.arch_name(),
        match &args.tokenizer {
            Some(dir) => format!("tokenizer from {}", dir.display()),
            None => "no tokenizer".into(),
        }
    );
    print_summary(
        &args.output,
        size,
        elapsed,
        summary.dense_count,
        summary.dense_bytes,
        &summaries,
    );
    outln!(
        "throughput: {:.2} GB/s written",
        size as f64 / 1e9 / elapsed.as_secs_f64().max(1e-9)
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variants_parse_and_reject_duplicates_and_unknowns() {
        let v = parse_variants("f16,int8,int4,int2", None).unwrap();
        assert_eq!(
            v.iter().map(|v| v.name()).collect::<Vec<_>>(),
            ["f16", "int8/g64", "int4/g64", "int2/g64"]
        );
        assert_eq!(parse_variants("int4", Some(32)).unwrap()[0].group_size, 32);
        let e = parse_variants("f16,int5", None).unwrap_err().to_string();
        assert!(
            e.contains("int5") && e.contains("known: f16, bf16, int8, int4, int4k, int3, int2"),
            "{e}"
        );
        let e = parse_variants("int4,int4/g64", None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("listed twice"), "{e}");
        assert!(parse_variants("int4,int4/g32", None).is_ok());
        assert!(parse_dense(Some("f8"), None)
            .unwrap_err()
            .to_string()
            .contains("f32, f16, bf16, int8, int4"));
        let plan = parse_dense(Some("bf16"), None).unwrap();
        assert_eq!(
            plan.matrix_type("output.weight", crate::format::DType::F16),
            crate::format::DType::Bf16
        );
    }

    #[test]
    fn output_directory_must_exist() {
        assert!(check_output(Path::new("x.hob")).is_ok());
        let e = check_output(Path::new("/nonexistent-hob-dir/x.hob")).unwrap_err();
        assert!(e.to_string().contains("/nonexistent-hob-dir"), "{e}");
    }

    #[test]
    fn output_naming_a_directory_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display().to_string();
        for out in [
            d.clone(),
            format!("{d}/"),
            format!("{d}/missing/"),
            "/".into(),
        ] {
            let e = check_output(Path::new(&out)).unwrap_err().to_string();
            assert!(e.contains(&format!("-o {out}: names a directory")), "{e}");
        }
    }
}
