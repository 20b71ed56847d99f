#!/usr/bin/env python3
"""Reader for .hob files (formats/hob.md), standard library only.

    python3 formats/hob.py FILE                 list header, metadata, tensors and experts
    python3 formats/hob.py FILE --json          the same as JSON
    python3 formats/hob.py FILE --dequant LAYER EXPERT VARIANT_INDEX {gate,up,down} [--out F]
                                                dequantize one expert matrix to floats (one row
                                                per line, or JSON to --out)

Validates magic, version, the header and section CRC32Cs and the table bounds; it is a
reference for the spec, not a replacement for the Rust reader's full validation.
"""

import argparse
import json
import struct
import sys

MAGIC = b"HOBFILE\0"
VERSION = 1
HEADER_SIZE = 256
BLOB_ALIGN = 4096
SUBARRAY_ALIGN = 64

DTYPES = {0: ("f32", 4), 1: ("f16", 2), 30: ("bf16", 2)}
# code -> (name, bits, is_float, has_mins)
VARIANT_KINDS = {
    1: ("f16", 16, True, False),
    2: ("bf16", 16, True, False),
    3: ("int8", 8, False, False),
    4: ("int4", 4, False, True),
    5: ("int2", 2, False, True),
}
META_TYPES = ["u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64"]
SCALAR_FMT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 10: "<Q", 11: "<q", 12: "<d"}


class HobError(Exception):
    pass


def _crc32c_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC_TABLE = _crc32c_table()


def crc32c(data):
    c = 0xFFFFFFFF
    t = _CRC_TABLE
    for b in data:
        c = t[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


class Cursor:
    def __init__(self, data, section):
        self.data, self.pos, self.section = data, 0, section

    def take(self, n, what):
        if n > len(self.data) - self.pos:
            raise HobError(f"{self.section}: {what} needs {n} bytes at offset {self.pos}")
        b = self.data[self.pos:self.pos + n]
        self.pos += n
        return b

    def unpack(self, fmt, what):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what):
        n = self.unpack("<Q", what + " length")
        try:
            return bytes(self.take(n, what)).decode("utf-8")
        except UnicodeDecodeError:
            raise HobError(f"{self.section}: {what} is not valid UTF-8")


def read_value(c, ty, key, depth=0):
    if ty in SCALAR_FMT:
        return c.unpack(SCALAR_FMT[ty], f"value of '{key}'")
    if ty == 7:
        b = c.unpack("<B", f"value of '{key}'")
        if b > 1:
            raise HobError(f"metadata key '{key}': bool stored as {b}")
        return bool(b)
    if ty == 8:
        return c.string(f"string value of '{key}'")
    if ty == 9:
        if depth >= 16:
            raise HobError(f"metadata key '{key}': arrays nested too deep")
        elem = c.unpack("<I", f"array type of '{key}'")
        if elem >= len(META_TYPES):
            raise HobError(f"metadata key '{key}': unknown array element type {elem}")
        n = c.unpack("<Q", f"array count of '{key}'")
        if n > len(c.data) - c.pos:
            raise HobError(f"metadata key '{key}': array count {n} exceeds the section")
        return {"elem_type": META_TYPES[elem], "items": [read_value(c, elem, key, depth + 1) for _ in range(n)]}
    raise HobError(f"metadata key '{key}': unknown value type {ty}")


def decode_metadata(data):
    c = Cursor(data, "metadata section")
    n = c.unpack("<Q", "entry count")
    if n * 13 > len(data):
        raise HobError(f"metadata section: entry count {n} exceeds the section")
    entries, seen = [], set()
    for i in range(n):
        key = c.string(f"key of entry #{i}")
        if key in seen:
            raise HobError(f"metadata key '{key}': duplicate key")
        seen.add(key)
        ty = c.unpack("<I", f"type of '{key}'")
        entries.append({"key": key, "type": META_TYPES[ty] if ty < len(META_TYPES) else ty,
                        "value": read_value(c, ty, key)})
    if c.pos != len(data):
        raise HobError("metadata section: bytes left after the last entry")
    return entries


def align_up(n, a):
    return (n + a - 1) // a * a


def matrix_layout(kind, group, rows, cols):
    """Byte ranges of one stored matrix (mirrors Variant::matrix_layout in variant.rs)."""
    name, bits, is_float, has_mins = VARIANT_KINDS[kind]
    n = rows * cols
    if is_float:
        return {"rows": rows, "cols": cols, "codes": (0, 2 * n), "scales": (2 * n, 2 * n),
                "mins": (2 * n, 2 * n), "size": align_up(2 * n, SUBARRAY_ALIGN)}
    if cols % group:
        raise HobError(f"{name}/g{group}: {cols} columns are not a multiple of the group size")
    codes_len = n * bits // 8
    side = rows * (cols // group) * 2
    s0 = align_up(codes_len, SUBARRAY_ALIGN)
    end = s0 + side
    mins = (end, end)
    if has_mins:
        m0 = align_up(end, SUBARRAY_ALIGN)
        mins = (m0, m0 + side)
        end = m0 + side
    return {"rows": rows, "cols": cols, "codes": (0, codes_len), "scales": (s0, s0 + side), "mins": mins,
            "size": align_up(end, SUBARRAY_ALIGN)}


def expert_layout(kind, group, hidden, ffn):
    gate = matrix_layout(kind, group, ffn, hidden)
    up = matrix_layout(kind, group, ffn, hidden)
    down = matrix_layout(kind, group, hidden, ffn)
    size = gate["size"] + up["size"] + down["size"]
    return {"gate": (0, gate), "up": (gate["size"], up), "down": (gate["size"] + up["size"], down),
            "size": size, "padded_size": align_up(size, BLOB_ALIGN)}


def variant_name(kind, group):
    name, _, is_float, _ = VARIANT_KINDS[kind]
    return name if is_float else f"{name}/g{group}"


class HobFile:
    def __init__(self, path):
        with open(path, "rb") as f:
            self.data = f.read()
        d = self.data
        if d[:8] != MAGIC[:min(8, len(d))] or len(d) < 8:
            raise HobError(f"{path}: not a .hob file (magic {d[:8]!r})")
        if len(d) < 12:
            raise HobError(f"{path}: truncated header")
        version = struct.unpack_from("<I", d, 8)[0]
        if version != VERSION:
            raise HobError(f"{path}: unsupported version {version} (this reader reads {VERSION})")
        if len(d) < HEADER_SIZE:
            raise HobError(f"{path}: truncated header")
        stored = struct.unpack_from("<I", d, HEADER_SIZE - 4)[0]
        if crc32c(d[:HEADER_SIZE - 4]) != stored:
            raise HobError(f"{path}: header checksum mismatch")
        names = ["file_size", "metadata_offset", "metadata_len", "tensors_offset", "tensors_len", "tensor_count",
                 "experts_offset", "experts_len", "data_offset", "data_len"]
        h = {"version": version, "header_size": struct.unpack_from("<I", d, 12)[0]}
        h.update(zip(names, struct.unpack_from("<10Q", d, 16)))
        h.update(zip(["metadata_crc32c", "tensors_crc32c", "experts_crc32c"], struct.unpack_from("<3I", d, 96)))
        self.header = h
        if h["file_size"] != len(d):
            raise HobError(f"{path}: header says {h['file_size']} bytes, the file has {len(d)}")
        sections = {}
        for s, crc in [("metadata", "metadata_crc32c"), ("tensors", "tensors_crc32c"), ("experts", "experts_crc32c")]:
            off, n = h[s + "_offset"], h[s + "_len"]
            if off + n > len(d):
                raise HobError(f"{path}: {s} section runs past the end of the file")
            sections[s] = d[off:off + n]
            if crc32c(sections[s]) != h[crc]:
                raise HobError(f"{path}: {s} section checksum mismatch")
        self.metadata = decode_metadata(sections["metadata"])
        self.tensors = self._tensors(sections["tensors"], h["tensor_count"])
        self._experts(sections["experts"])

    def _tensors(self, data, count):
        c = Cursor(data, "tensor table")
        if count * 44 > len(data):
            raise HobError(f"tensor table: tensor count {count} exceeds the table")
        out = []
        for i in range(count):
            name = c.string(f"name of tensor #{i}")
            code = c.unpack("<I", "dtype")
            kind, group = code >> 16, code & 0xFFFF
            packed = code not in DTYPES and kind in VARIANT_KINDS and not VARIANT_KINDS[kind][2]
            if code not in DTYPES and not (packed and group and group % 16 == 0 and group <= 4096):
                raise HobError(f"tensor '{name}': unknown dtype code {code}")
            ndim = c.unpack("<I", "ndim")
            if ndim not in (1, 2):
                raise HobError(f"tensor '{name}': ndim {ndim}")
            shape = [c.unpack("<Q", "dim") for _ in range(ndim)]
            offset, size, crc = c.unpack("<Q", "offset"), c.unpack("<Q", "size"), c.unpack("<I", "crc32c")
            n = 1
            for x in shape:
                n *= x
            if packed:
                if ndim != 2:
                    raise HobError(f"tensor '{name}': a packed dtype needs a matrix")
                want = matrix_layout(kind, group, shape[0], shape[1])["size"]
                dtype = f"{VARIANT_KINDS[kind][0]}/g{group}"
            else:
                want, dtype = n * DTYPES[code][1], DTYPES[code][0]
            if want != size:
                raise HobError(f"tensor '{name}': size {size} does not match its shape")
            if offset % BLOB_ALIGN or offset + size > len(self.data):
                raise HobError(f"tensor '{name}': offset {offset} misaligned or out of the file")
            out.append({"name": name, "dtype": dtype, "shape": shape, "offset": offset, "size": size,
                        "crc32c": crc})
        return out

    def _experts(self, data):
        c = Cursor(data, "expert table")
        self.n_layers, self.n_experts, self.hidden, self.ffn, nv, _ = struct.unpack("<6I", c.take(24, "header"))
        self.variants = []
        for i in range(nv):
            kind, group, _, _ = struct.unpack("<4I", c.take(16, f"variant #{i}"))
            if kind not in VARIANT_KINDS:
                raise HobError(f"expert table variant #{i}: unknown variant code {kind} (newer file?)")
            lay = expert_layout(kind, group, self.hidden, self.ffn)
            self.variants.append({"kind": VARIANT_KINDS[kind][0], "code": kind, "group_size": group,
                                  "name": variant_name(kind, group), "layout": lay})
        self.records = []
        for i in range(self.n_layers * self.n_experts * nv):
            offset, size, crc, _ = struct.unpack("<QQII", c.take(24, f"record #{i}"))
            v = i % nv
            if size != self.variants[v]["layout"]["size"]:
                raise HobError(f"expert record #{i}: size {size} does not match the layout")
            if offset % BLOB_ALIGN or offset + size > len(self.data):
                raise HobError(f"expert record #{i}: offset {offset} misaligned or out of the file")
            le = i // nv
            self.records.append({"layer": le // self.n_experts, "expert": le % self.n_experts, "variant": v,
                                 "offset": offset, "size": size, "crc32c": crc})
        if c.pos != len(data):
            raise HobError("expert table: bytes left after the last record")

    def listing(self):
        return {
            "header": self.header,
            "metadata": self.metadata,
            "tensors": self.tensors,
            "experts": {
                "n_layers": self.n_layers, "n_experts": self.n_experts, "hidden": self.hidden, "ffn": self.ffn,
                "variants": [{k: v[k] for k in ("kind", "code", "group_size", "name")}
                             | {"size": v["layout"]["size"], "padded_size": v["layout"]["padded_size"]}
                             for v in self.variants],
                "records": self.records,
            },
        }

    def dequant(self, layer, expert, v, which):
        """One expert matrix as a list of rows of floats, by the formulas of formats/hob.md."""
        if not (layer < self.n_layers and expert < self.n_experts and v < len(self.variants)):
            raise HobError(f"expert ({layer}, {expert}, {v}) out of range")
        var = self.variants[v]
        rec = self.records[(layer * self.n_experts + expert) * len(self.variants) + v]
        moff, m = var["layout"][which]
        base = rec["offset"] + moff
        rows, cols = m["rows"], m["cols"]
        codes = self.data[base + m["codes"][0]:base + m["codes"][1]]
        kind, group = var["kind"], var["group_size"]
        if kind == "f16":
            flat = struct.unpack(f"<{rows * cols}e", codes)
            return [list(flat[r * cols:(r + 1) * cols]) for r in range(rows)]
        if kind == "bf16":
            raw = struct.unpack(f"<{rows * cols}H", codes)
            flat = [struct.unpack("<f", struct.pack("<I", x << 16))[0] for x in raw]
            return [flat[r * cols:(r + 1) * cols] for r in range(rows)]
        groups = cols // group
        scales = struct.unpack(f"<{rows * groups}e", self.data[base + m["scales"][0]:base + m["scales"][1]])
        mins = (struct.unpack(f"<{rows * groups}e", self.data[base + m["mins"][0]:base + m["mins"][1]])
                if kind != "int8" else None)
        out = []
        for r in range(rows):
            row = []
            for col in range(cols):
                i = r * cols + col
                if kind == "int8":
                    q = struct.unpack_from("<b", codes, i)[0]
                elif kind == "int4":
                    q = (codes[i // 2] >> (4 * (i % 2))) & 0xF
                else:
                    q = (codes[i // 4] >> (2 * (i % 4))) & 0x3
                g = r * groups + col // group
                w = scales[g] * q + (mins[g] if mins is not None else 0.0)
                row.append(w)
            out.append(row)
        return out


def _print_listing(f):
    h = f.header
    print(f"hob version {h['version']}, {h['file_size']} bytes")
    for k, v in h.items():
        print(f"  {k:16} {v}")
    print(f"metadata ({len(f.metadata)} keys)")
    for e in f.metadata:
        v = e["value"]
        s = repr(v) if not isinstance(v, str) or len(v) < 80 else repr(v[:77]) + "..."
        print(f"  {e['key']} ({e['type']}) = {s}")
    print(f"tensors ({len(f.tensors)})")
    for t in f.tensors:
        print(f"  {t['name']:40} {t['dtype']:5} {t['shape']} @ {t['offset']} ({t['size']} bytes)")
    print(f"experts: {f.n_layers} layers x {f.n_experts} experts, hidden {f.hidden}, ffn {f.ffn}")
    for i, v in enumerate(f.variants):
        print(f"  variant #{i}: {v['name']}, {v['layout']['size']} bytes per expert")


def main(argv=None):
    ap = argparse.ArgumentParser(description="List or dequantize a .hob file")
    ap.add_argument("file")
    ap.add_argument("--json", action="store_true", help="print the listing as JSON")
    ap.add_argument("--dequant", nargs=4, metavar=("LAYER", "EXPERT", "VARIANT_INDEX", "MATRIX"))
    ap.add_argument("--out", help="write --dequant values as JSON [[row], ...] to this file")
    args = ap.parse_args(argv)
    try:
        f = HobFile(args.file)
        if args.dequant:
            layer, expert, v, which = args.dequant
            if which not in ("gate", "up", "down"):
                raise HobError(f"matrix must be gate, up or down, not {which}")
            rows = f.dequant(int(layer), int(expert), int(v), which)
            if args.out:
                with open(args.out, "w") as o:
                    json.dump(rows, o)
            else:
                for row in rows:
                    print(" ".join(repr(x) for x in row))
        elif args.json:
            json.dump(f.listing(), sys.stdout, indent=1)
            print()
        else:
            _print_listing(f)
    except HobError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
