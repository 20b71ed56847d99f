//! Reading a .hob file: mmap, validate everything, then hand out zero-copy views.
//!
//! Validation is the pure function [`parse`] over bytes, so tests and fuzzers need no files;
//! [`HobFile::open`] maps the file and calls it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use super::checked::BlobChecks;
use super::cursor::Cursor;
use super::header::{self, HEADER_SIZE};
use super::open::{open_regular, GGUF_MAGIC};
use super::{
    align_up, ap8, ExpertLayout, FormatError, MatrixLayout, Metadata, TensorType, Variant,
    VariantKind, BLOB_ALIGN,
};

pub use super::header::reseal;

/// Smallest dense tensor table entry: empty name (8), dtype (4), ndim (4), one dim (8),
/// offset (8), size (8), crc (4).
pub(crate) const MIN_TENSOR_ENTRY: u64 = 44;
/// Expert table header: n_layers, n_experts, hidden, ffn, n_variants, reserved (u32 each).
pub(crate) const EXPERT_TABLE_HEADER: u64 = 24;
/// Per-variant descriptor: kind code, group size, two reserved u32.
pub(crate) const VARIANT_DESCRIPTOR: u64 = 16;
/// Per-(layer, expert, variant) record: offset u64, size u64, crc32c u32, reserved u32.
pub(crate) const EXPERT_RECORD: u64 = 24;

/// The fixed header (formats/hob.md, "Header").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    pub version: u32,
    pub file_size: u64,
    pub metadata_offset: u64,
    pub metadata_len: u64,
    pub tensors_offset: u64,
    pub tensors_len: u64,
    pub tensor_count: u64,
    pub experts_offset: u64,
    pub experts_len: u64,
    pub data_offset: u64,
    pub data_len: u64,
    pub metadata_crc32c: u32,
    pub tensors_crc32c: u32,
    pub experts_crc32c: u32,
}

/// One dense tensor table entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    pub dtype: TensorType,
    /// [n] or [rows, cols].
    pub shape: Vec<usize>,
    /// Absolute file offset.
    pub offset: u64,
    pub size: u64,
    pub crc32c: u32,
}

/// One expert table record, for (layer, expert, variant).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpertRecord {
    pub offset: u64,
    pub size: u64,
    pub crc32c: u32,
}

pub struct TensorView<'a> {
    pub info: &'a TensorInfo,
    pub data: &'a [u8],
}

/// One stored matrix of an expert: the sub-arrays of `MatrixLayout`, sliced.
#[derive(Clone, Copy, Debug)]
pub struct MatrixView<'a> {
    pub variant: Variant,
    pub rows: usize,
    pub cols: usize,
    pub codes: &'a [u8],
    pub scales: &'a [u8],
    pub mins: &'a [u8],
    /// Which matrix of its expert this is (0 gate, 1 up, 2 down): an ap8 view's `codes` are
    /// the whole prefix, whose pieces for each matrix are interleaved (format::ap8).
    pub part: u8,
}

#[derive(Clone, Copy, Debug)]
pub struct ExpertView<'a> {
    pub variant: Variant,
    pub layout: &'a ExpertLayout,
    /// The blob's `size` bytes (padding excluded), 4 KiB-aligned in the mmap.
    pub data: &'a [u8],
}

impl<'a> ExpertView<'a> {
    pub fn gate(&self) -> MatrixView<'a> {
        self.matrix(self.layout.gate_offset, &self.layout.gate, 0)
    }
    pub fn up(&self) -> MatrixView<'a> {
        self.matrix(self.layout.up_offset, &self.layout.up, 1)
    }
    pub fn down(&self) -> MatrixView<'a> {
        self.matrix(self.layout.down_offset, &self.layout.down, 2)
    }

    fn matrix(&self, offset: usize, m: &MatrixLayout, part: u8) -> MatrixView<'a> {
        // parse() checked data.len() == layout.size, which contains every matrix.
        MatrixView {
            part,
            ..m.view(self.variant, &self.data[offset..offset + m.size])
        }
    }
}

/// Everything [`parse`] learned from a valid file. Offsets are absolute and proven in bounds of
/// the bytes it was parsed from; the views take those bytes again.
#[derive(Clone, Debug)]
pub struct Parsed {
    pub header: Header,
    pub metadata: Metadata,
    pub tensors: Vec<TensorInfo>,
    pub n_layers: usize,
    pub n_experts: usize,
    pub hidden: usize,
    pub ffn: usize,
    /// The stored variants (the expert table's, in its order), then a view for each width under
    /// 8 of every ap8 variant (`Variant::is_view`: its records the stored blob's prefixes).
    pub variants: Vec<Variant>,
    /// How many of `variants` the expert table lists.
    pub n_stored: usize,
    /// One per variant.
    pub layouts: Vec<ExpertLayout>,
    /// Index `(layer * n_experts + expert) * n_variants + variant`.
    pub records: Vec<ExpertRecord>,
}

/// The name errors use for a blob, e.g. "expert (layer 1, expert 2, variant int4/g64)".
pub fn expert_name(layer: usize, expert: usize, variant: &Variant) -> String {
    format!("expert (layer {layer}, expert {expert}, variant {variant})")
}

impl Parsed {
    pub fn record_index(&self, layer: usize, expert: usize, v: usize) -> usize {
        assert!(
            layer < self.n_layers && expert < self.n_experts && v < self.variants.len(),
            "expert ({layer}, {expert}, {v}) out of range ({}, {}, {})",
            self.n_layers,
            self.n_experts,
            self.variants.len()
        );
        (layer * self.n_experts + expert) * self.variants.len() + v
    }

    /// Bytes of tensor `i`. `bytes` must be what this was parsed from.
    pub fn tensor_data<'b>(&self, bytes: &'b [u8], i: usize) -> &'b [u8] {
        let t = &self.tensors[i];
        &bytes[t.offset as usize..(t.offset + t.size) as usize]
    }

    /// View of one blob. `bytes` must be what this was parsed from.
    pub fn expert_view<'s, 'b: 's>(
        &'s self,
        bytes: &'b [u8],
        layer: usize,
        expert: usize,
        v: usize,
    ) -> ExpertView<'s> {
        let r = self.records[self.record_index(layer, expert, v)];
        ExpertView {
            variant: self.variants[v],
            layout: &self.layouts[v],
            data: &bytes[r.offset as usize..(r.offset + r.size) as usize],
        }
    }

    /// Check every tensor and blob CRC, in file order; the error names the first bad one.
    pub fn verify(&self, bytes: &[u8]) -> Result<(), FormatError> {
        for (i, t) in self.tensors.iter().enumerate() {
            check_crc(
                &format!("tensor '{}'", t.name),
                t.crc32c,
                self.tensor_data(bytes, i),
            )?;
        }
        for layer in 0..self.n_layers {
            for expert in 0..self.n_experts {
                // A view's bytes are its stored blob's.
                for (v, variant) in self.variants[..self.n_stored].iter().enumerate() {
                    let r = self.records[self.record_index(layer, expert, v)];
                    let data = &bytes[r.offset as usize..(r.offset + r.size) as usize];
                    check_crc(&expert_name(layer, expert, variant), r.crc32c, data)?;
                }
            }
        }
        Ok(())
    }
}

fn check_crc(what: &str, stored: u32, data: &[u8]) -> Result<(), FormatError> {
    let computed = crc32c::crc32c(data);
    if stored != computed {
        return Err(FormatError::Checksum {
            what: what.to_string(),
            stored,
            computed,
        });
    }
    Ok(())
}

fn invalid(what: impl Into<String>, detail: impl Into<String>) -> FormatError {
    FormatError::Invalid {
        what: what.into(),
        detail: detail.into(),
    }
}

fn to_usize(what: &str, v: u64) -> Result<usize, FormatError> {
    usize::try_from(v)
        .map_err(|_| invalid(what, format!("{v} does not fit in memory on this machine")))
}

/// Validate a whole .hob file held in `bytes` (formats/hob.md, "Validation"). Never panics; on
/// success every offset in the result is in bounds of `bytes` and no two items overlap.
pub fn parse(bytes: &[u8]) -> Result<Parsed, FormatError> {
    let file_size = bytes.len() as u64;
    let header = header::decode(bytes)?;
    if header.file_size != file_size {
        if header.file_size > file_size {
            return Err(FormatError::Truncated {
                what: "file (size from the header)".to_string(),
                start: 0,
                end: header.file_size,
                file_size,
            });
        }
        return Err(invalid(
            "header.file_size",
            format!(
                "header says {} bytes, the file has {file_size}",
                header.file_size
            ),
        ));
    }

    let h = &header;
    let sections = [
        ("metadata section", h.metadata_offset, h.metadata_len),
        ("tensor table", h.tensors_offset, h.tensors_len),
        ("expert table", h.experts_offset, h.experts_len),
        ("data section", h.data_offset, h.data_len),
    ];
    let mut ranges: Vec<(&str, u64, u64)> = vec![("header", 0, HEADER_SIZE as u64)];
    for (what, off, len) in sections {
        let end = off
            .checked_add(len)
            .ok_or_else(|| invalid(what, format!("offset {off} + length {len} overflows")))?;
        if end > file_size {
            return Err(FormatError::Truncated {
                what: what.to_string(),
                start: off,
                end,
                file_size,
            });
        }
        for &(other, s, e) in &ranges {
            if off < e && s < end {
                return Err(FormatError::Overlap {
                    a: format!("{what} ({off}..{end})"),
                    b: format!("{other} ({s}..{e})"),
                });
            }
        }
        ranges.push((what, off, end));
    }
    if h.data_offset % BLOB_ALIGN as u64 != 0 {
        return Err(FormatError::Misaligned {
            what: "data section".to_string(),
            offset: h.data_offset,
            align: BLOB_ALIGN as u64,
        });
    }
    // Bounds checked above and file_size == bytes.len(), so these slices are in range.
    let section = |off: u64, len: u64| &bytes[off as usize..(off + len) as usize];
    let meta_bytes = section(h.metadata_offset, h.metadata_len);
    let tensor_bytes = section(h.tensors_offset, h.tensors_len);
    let expert_bytes = section(h.experts_offset, h.experts_len);
    check_crc("metadata section", h.metadata_crc32c, meta_bytes)?;
    check_crc("tensor table", h.tensors_crc32c, tensor_bytes)?;
    check_crc("expert table", h.experts_crc32c, expert_bytes)?;

    let metadata = Metadata::decode(meta_bytes)?;
    let tensors = parse_tensor_table(tensor_bytes, h.tensor_count)?;
    let mut parsed = Parsed {
        header: header.clone(),
        metadata,
        tensors,
        n_layers: 0,
        n_experts: 0,
        hidden: 0,
        ffn: 0,
        variants: Vec::new(),
        n_stored: 0,
        layouts: Vec::new(),
        records: Vec::new(),
    };
    parse_expert_table(expert_bytes, &mut parsed)?;
    check_placement(&parsed)?;
    add_views(&mut parsed)?;
    Ok(parsed)
}

/// After the stored variants, a view of every ap8 variant at each width 2..=7: records with the
/// stored blob's offset and the width's prefix as size (their checksums are in the blob's header,
/// checked by BlobChecks).
fn add_views(p: &mut Parsed) -> Result<(), FormatError> {
    let stored = p.variants.clone();
    p.n_stored = stored.len();
    let views: Vec<(usize, Variant)> = stored
        .iter()
        .enumerate()
        .filter(|(_, v)| v.kind == VariantKind::Ap8)
        .flat_map(|(i, v)| (ap8::MIN_WIDTH..ap8::MAX_WIDTH).map(move |k| (i, v.at_width(k))))
        .collect();
    if views.is_empty() {
        return Ok(());
    }
    for (_, v) in &views {
        let layout = v
            .expert_layout(p.hidden, p.ffn)
            .map_err(|e| invalid(format!("expert variant {v}"), e))?;
        p.layouts.push(layout);
        p.variants.push(*v);
    }
    let (ns, nv) = (stored.len(), p.variants.len());
    let old = std::mem::take(&mut p.records);
    p.records.reserve_exact(old.len() / ns * nv);
    for cell in old.chunks_exact(ns) {
        p.records.extend_from_slice(cell);
        for (j, &(i, _)) in views.iter().enumerate() {
            p.records.push(ExpertRecord {
                size: p.layouts[ns + j].size as u64,
                crc32c: 0,
                ..cell[i]
            });
        }
    }
    Ok(())
}

fn parse_tensor_table(bytes: &[u8], count: u64) -> Result<Vec<TensorInfo>, FormatError> {
    let mut c = Cursor::new(bytes, "tensor table");
    let count = c.check_count("tensor count", count, MIN_TENSOR_ENTRY)?;
    let mut tensors = Vec::with_capacity(count);
    let mut seen = HashMap::with_capacity(count);
    for i in 0..count {
        let name = c.string(&|| format!("name of tensor #{i}"))?;
        let what = format!("tensor '{name}'");
        if name.is_empty() {
            return Err(invalid(format!("tensor #{i}"), "empty name"));
        }
        if seen.insert(name.clone(), i).is_some() {
            return Err(invalid(what, "duplicate name"));
        }
        let code = c.u32(|| format!("{what} dtype"))?;
        let dtype = TensorType::from_code(code).map_err(|e| invalid(format!("{what} dtype"), e))?;
        let ndim = c.u32(|| format!("{what} ndim"))?;
        if !(1..=2).contains(&ndim) {
            return Err(invalid(
                format!("{what} ndim"),
                format!("expected 1 or 2, found {ndim}"),
            ));
        }
        let mut shape = Vec::with_capacity(ndim as usize);
        let mut elems: u64 = 1;
        for d in 0..ndim {
            let dim = c.u64(|| format!("{what} dim {d}"))?;
            if dim == 0 {
                return Err(invalid(format!("{what} dim {d}"), "zero"));
            }
            elems = elems
                .checked_mul(dim)
                .ok_or_else(|| invalid(format!("{what} shape"), "element count overflows"))?;
            shape.push(to_usize(&format!("{what} dim {d}"), dim)?);
        }
        let offset = c.u64(|| format!("{what} offset"))?;
        let size = c.u64(|| format!("{what} size"))?;
        let crc32c = c.u32(|| format!("{what} crc32c"))?;
        let expected = dtype
            .size(&shape)
            .map_err(|e| invalid(format!("{what} shape"), e))?;
        if expected as u64 != size {
            return Err(invalid(
                format!("{what} size"),
                format!("shape {shape:?} of {dtype} needs {expected} bytes, the table says {size}"),
            ));
        }
        tensors.push(TensorInfo {
            name,
            dtype,
            shape,
            offset,
            size,
            crc32c,
        });
    }
    if c.remaining() != 0 {
        return Err(invalid(
            "tensor table",
            format!("{} bytes left after {count} entries", c.remaining()),
        ));
    }
    Ok(tensors)
}

fn parse_expert_table(bytes: &[u8], p: &mut Parsed) -> Result<(), FormatError> {
    let mut c = Cursor::new(bytes, "expert table");
    let mut field = |name: &'static str| c.u32(|| name.to_string());
    let n_layers = field("n_layers")?;
    let n_experts = field("n_experts")?;
    let hidden = field("hidden")?;
    let ffn = field("ffn")?;
    let n_variants = field("n_variants")?;
    if field("reserved")? != 0 {
        return Err(invalid("expert table reserved field", "must be zero"));
    }
    let n_variants = c.check_count("variant count", n_variants.into(), VARIANT_DESCRIPTOR)?;
    for i in 0..n_variants {
        let what = format!("expert table variant #{i}");
        let code = c.u32(|| format!("{what} kind"))?;
        let group_size = c.u32(|| format!("{what} group size"))?;
        let r0 = c.u32(|| format!("{what} reserved"))?;
        let r1 = c.u32(|| format!("{what} reserved"))?;
        let kind = VariantKind::from_code(code).ok_or(FormatError::UnknownVariant {
            code,
            what: what.clone(),
        })?;
        let variant = Variant::new(kind, group_size).map_err(|e| invalid(&what, e))?;
        if r0 != 0 || r1 != 0 {
            return Err(invalid(format!("{what} reserved fields"), "must be zero"));
        }
        if p.variants.contains(&variant) {
            return Err(invalid(what, format!("{variant} listed twice")));
        }
        p.variants.push(variant);
    }
    let cells = u64::from(n_layers) * u64::from(n_experts);
    if cells > 0 && n_variants == 0 {
        return Err(invalid(
            "expert table",
            format!("{n_layers} x {n_experts} experts but no variants"),
        ));
    }
    if n_variants > 0 && (hidden == 0 || ffn == 0) {
        return Err(invalid(
            "expert table",
            format!("expert dims hidden {hidden}, ffn {ffn} must be non-zero"),
        ));
    }
    // Saturates rather than wraps: an impossible count then fails the bound below.
    let n_records = cells.saturating_mul(n_variants as u64);
    let n_records = c.check_count(
        "expert record count (n_layers x n_experts x n_variants)",
        n_records,
        EXPERT_RECORD,
    )?;
    p.n_layers = to_usize("n_layers", n_layers.into())?;
    p.n_experts = to_usize("n_experts", n_experts.into())?;
    p.hidden = to_usize("hidden", hidden.into())?;
    p.ffn = to_usize("ffn", ffn.into())?;
    for v in &p.variants {
        let layout = v
            .expert_layout(p.hidden, p.ffn)
            .map_err(|e| invalid(format!("expert variant {v}"), e))?;
        p.layouts.push(layout);
    }
    p.records.reserve_exact(n_records);
    for i in 0..n_records {
        let v = i % n_variants;
        let le = i / n_variants;
        let name = expert_name(le / p.n_experts, le % p.n_experts, &p.variants[v]);
        let offset = c.u64(|| format!("{name} offset"))?;
        let size = c.u64(|| format!("{name} size"))?;
        let crc32c = c.u32(|| format!("{name} crc32c"))?;
        if c.u32(|| format!("{name} reserved"))? != 0 {
            return Err(invalid(format!("{name} reserved field"), "must be zero"));
        }
        let expected = p.layouts[v].size as u64;
        if size != expected {
            return Err(invalid(
                format!("{name} size"),
                format!(
                    "the {} layout of [{}, {}] needs {expected} bytes, the record says {size}",
                    p.variants[v], p.hidden, p.ffn
                ),
            ));
        }
        p.records.push(ExpertRecord {
            offset,
            size,
            crc32c,
        });
    }
    if c.remaining() != 0 {
        return Err(invalid(
            "expert table",
            format!("{} bytes left after {n_records} records", c.remaining()),
        ));
    }
    Ok(())
}

/// Every tensor and blob: aligned, inside the data section with its padding, and overlapping
/// nothing else.
fn check_placement(p: &Parsed) -> Result<(), FormatError> {
    let h = &p.header;
    let (data_start, data_end) = (h.data_offset, h.data_offset + h.data_len);
    let mut items: Vec<(u64, u64, usize)> = Vec::with_capacity(p.tensors.len() + p.records.len());
    let name = |i: usize| -> String {
        if i < p.tensors.len() {
            format!("tensor '{}'", p.tensors[i].name)
        } else {
            let r = i - p.tensors.len();
            let nv = p.variants.len();
            expert_name(
                r / nv / p.n_experts,
                r / nv % p.n_experts,
                &p.variants[r % nv],
            )
        }
    };
    let extents = p
        .tensors
        .iter()
        .map(|t| (t.offset, t.size))
        .chain(p.records.iter().map(|r| (r.offset, r.size)));
    for (i, (offset, size)) in extents.enumerate() {
        if offset % BLOB_ALIGN as u64 != 0 {
            return Err(FormatError::Misaligned {
                what: name(i),
                offset,
                align: BLOB_ALIGN as u64,
            });
        }
        let end = usize::try_from(size)
            .ok()
            .and_then(|s| align_up(s, BLOB_ALIGN))
            .and_then(|padded| offset.checked_add(padded as u64))
            .ok_or_else(|| invalid(name(i), format!("offset {offset} + size {size} overflows")))?;
        if end > h.file_size {
            return Err(FormatError::Truncated {
                what: name(i),
                start: offset,
                end,
                file_size: h.file_size,
            });
        }
        if offset < data_start || end > data_end {
            return Err(invalid(
                name(i),
                format!("bytes {offset}..{end} (padding included) lie outside the data section {data_start}..{data_end}"),
            ));
        }
        items.push((offset, end, i));
    }
    items.sort_unstable();
    for w in items.windows(2) {
        if w[1].0 < w[0].1 {
            return Err(FormatError::Overlap {
                a: name(w[0].2),
                b: name(w[1].2),
            });
        }
    }
    Ok(())
}

pub struct HobFile {
    path: PathBuf,
    map: std::sync::Arc<Mmap>,
    parsed: Parsed,
    by_name: HashMap<String, usize>,
    /// Which expert blobs have passed their checksum (checked on first read).
    checks: std::sync::Arc<BlobChecks>,
    /// Every dense tensor has passed its checksum.
    dense_verified: std::sync::atomic::AtomicBool,
}

impl HobFile {
    /// Open, mmap and validate (the header, the section checksums and every table: the data
    /// section's checksums are checked on first read, [`HobFile::verify_dense`] and
    /// [`HobFile::verify_expert`]). Only a regular file is opened: a directory, a FIFO or a
    /// device is refused by name, as is a GGUF file. Errors name the file and the field.
    pub fn open(path: &Path) -> Result<HobFile, FormatError> {
        let file = open_regular(path)?;
        // SAFETY: the map is read-only and private to this process, but its pages follow the
        // file: if another process truncates the file while it is mapped, reading the lost
        // pages raises SIGBUS, and writes by others show through. hob never modifies a .hob file
        // in place (the writer renames a new file over the old name, which leaves this mapping's
        // inode intact), and users must not truncate a model file that is being served.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| FormatError::io(path, "mmap", e))?;
        if map.is_empty() {
            return Err(FormatError::NotHob {
                path: path.to_path_buf(),
                what: "empty (0 bytes): expected a .hob file".into(),
            });
        }
        if map.starts_with(GGUF_MAGIC) {
            return Err(FormatError::NotHob {
                path: path.to_path_buf(),
                what: "a GGUF file; hob reads .hob files: convert it first with \
                       `hob convert --from FILE.gguf -o model.hob`"
                    .into(),
            });
        }
        let parsed = parse(&map).map_err(|e| e.in_file(path))?;
        let by_name = parsed
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        let map = std::sync::Arc::new(map);
        let checks = BlobChecks::new(path, map.clone(), &parsed);
        Ok(HobFile {
            path: path.to_path_buf(),
            map,
            parsed,
            by_name,
            checks: std::sync::Arc::new(checks),
            dense_verified: std::sync::atomic::AtomicBool::new(false),
        })
    }
    pub fn path(&self) -> &Path {
        &self.path
    }
    /// The whole file, mapped.
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }
    /// The whole mapped file, shareable with a loader thread (which may outlive a borrow).
    pub fn shared_map(&self) -> std::sync::Arc<Mmap> {
        self.map.clone()
    }
    /// Byte range in the file of an expert blob (`padded`: including its 4 KiB padding).
    pub fn blob_range(
        &self,
        layer: usize,
        expert: usize,
        variant: usize,
        padded: bool,
    ) -> std::ops::Range<usize> {
        let data = self.expert(layer, expert, variant).data;
        let start = data.as_ptr() as usize - self.map.as_ptr() as usize;
        let len = if padded {
            self.expert_layout(variant).padded_size
        } else {
            data.len()
        };
        start..start + len
    }
    pub fn parsed(&self) -> &Parsed {
        &self.parsed
    }
    pub fn header(&self) -> &Header {
        &self.parsed.header
    }
    pub fn metadata(&self) -> &Metadata {
        &self.parsed.metadata
    }
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.parsed.tensors
    }
    pub fn tensor(&self, name: &str) -> Option<TensorView<'_>> {
        let &i = self.by_name.get(name)?;
        Some(TensorView {
            info: &self.parsed.tensors[i],
            data: self.parsed.tensor_data(&self.map, i),
        })
    }
    pub fn n_layers(&self) -> usize {
        self.parsed.n_layers
    }
    pub fn n_experts(&self) -> usize {
        self.parsed.n_experts
    }
    /// Expert dims (hidden, ffn) from the expert table header.
    pub fn expert_dims(&self) -> (usize, usize) {
        (self.parsed.hidden, self.parsed.ffn)
    }
    pub fn variants(&self) -> &[Variant] {
        &self.parsed.variants
    }
    /// Layout shared by every expert of variant index `v`.
    pub fn expert_layout(&self, v: usize) -> &ExpertLayout {
        &self.parsed.layouts[v]
    }
    pub fn expert_record(&self, layer: usize, expert: usize, v: usize) -> ExpertRecord {
        self.parsed.records[self.parsed.record_index(layer, expert, v)]
    }
    /// Where blob (layer, expert, variant `v`) lies in the file: (offset, padded length). Both are
    /// multiples of [`BLOB_ALIGN`] (the padding is zeros), so this is exactly what an O_DIRECT
    /// read of the blob into an aligned buffer asks for; the blob's own bytes are the first
    /// `expert_record(..).size` of them. Panics on out-of-range indices, like [`HobFile::expert`].
    pub fn expert_span(&self, layer: usize, expert: usize, v: usize) -> (u64, u64) {
        let r = self.expert_record(layer, expert, v);
        // parse() proved offset + padded size lies inside the data section, so no overflow.
        let padded = r.size.div_ceil(BLOB_ALIGN as u64) * BLOB_ALIGN as u64;
        (r.offset, padded)
    }
    /// Zero-copy view of one expert blob. Panics on out-of-range indices (callers index by
    /// counts this file reported).
    pub fn expert(&self, layer: usize, expert: usize, v: usize) -> ExpertView<'_> {
        self.parsed.expert_view(&self.map, layer, expert, v)
    }
    /// Check every checksum; the error names the first bad tensor or (layer, expert, variant).
    pub fn verify(&self) -> Result<(), FormatError> {
        self.parsed.verify(&self.map)
    }
    /// Check every dense tensor's checksum, in file order, unless done already: what a model
    /// calls when it loads. The error names the file and the first bad tensor.
    pub fn verify_dense(&self) -> Result<(), FormatError> {
        self.verify_dense_with(crc32c::crc32c)
    }
    /// [`HobFile::verify_dense`] with `crc` computing each tensor's CRC-32C (e.g. on several
    /// threads: [`crc32c_pieces`](super::crc32c_pieces)).
    pub fn verify_dense_with(&self, crc: impl Fn(&[u8]) -> u32) -> Result<(), FormatError> {
        use std::sync::atomic::Ordering;
        if self.dense_verified.load(Ordering::Acquire) {
            return Ok(());
        }
        for (i, t) in self.parsed.tensors.iter().enumerate() {
            let computed = crc(self.parsed.tensor_data(&self.map, i));
            if computed != t.crc32c {
                return Err(FormatError::Checksum {
                    what: format!("tensor '{}'", t.name),
                    stored: t.crc32c,
                    computed,
                }
                .in_file(&self.path));
            }
        }
        self.dense_verified.store(true, Ordering::Release);
        Ok(())
    }
    /// Check expert blob (layer, expert, variant `v`)'s checksum the first time it is read in
    /// this process (later calls cost a bit test). The error names the file and the blob.
    pub fn verify_expert(&self, layer: usize, expert: usize, v: usize) -> Result<(), FormatError> {
        self.checks.expert(layer, expert, v)
    }
    /// The blobs' checksums and which have been checked, for a thread that copies blobs out of
    /// the map (the expert loader checks each blob beside its first load).
    pub fn blob_checks(&self) -> std::sync::Arc<BlobChecks> {
        self.checks.clone()
    }
}
