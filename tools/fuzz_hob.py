#!/usr/bin/env python3
"""Mutation fuzzer for hob's model reading: damaged .hob files against the commands that read them.

Each mutant is the seed .hob with one to three mutations aimed at its real structures (formats/hob.md):
random byte flips anywhere, in the data section, in the header and tables; metadata numbers set to extreme
values (1.4e-45, 0, -1, NaN, inf, huge); metadata string lengths; header, tensor-table and expert-table
fields; special floats (NaN, inf, huge) written into dense weights and expert blobs; truncation and
extension. Most mutants are then resealed (section and header CRCs recomputed, and for some also the CRCs of
the tensors and blobs they touched) so that they get past the checksums to the checks behind them.

Every mutant runs through each command (a case is one mutant x one command), with a timeout:
  inspect, inspect --verify, run -p hi -n 4 --temp 0 --device cpu,
  perplexity -c 16 on a small text, bench -p 8 -n 4 -r 1 --device cpu.
Outcomes: ok (exit 0); clean error (exit 1, and the "error:" line names the mutant's path); failures:
unnamed error (exit 1, the error line does not name the file), panic (exit 101 or "panicked"), hang
(timeout), signal (killed by a signal), odd exit (any other status). Failing cases are saved (mutant,
command, stderr, mutation) under --out, a few per distinct failure; the summary is printed and written to
--out/summary.txt (every distinct failure, counted: --out/signatures.txt). Exit status 1 when anything failed.

  python3 tools/fuzz_hob.py --minutes 10 --jobs 2                 # builds the tiny fixture's .hob
  python3 tools/fuzz_hob.py --hob target/release/hob --seed-file m.hob --cases 500 --out /tmp/fz

Python 3.11 standard library only.
"""

import argparse
import os
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "tiny-mixtral")
HEADER_SIZE = 256
FAILURES = ("unnamed error", "panic", "hang", "signal", "odd exit")
OUTCOMES = ("ok", "clean error") + FAILURES

# --- CRC32C (Castagnoli), as formats/hob.md specifies ------------------------------------------------------

def _crc_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc_table()


def crc32c(data):
    c = 0xFFFFFFFF
    t = _TABLE
    for b in data:
        c = t[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


assert crc32c(b"123456789") == 0xE3069283

# --- Where the seed's structures lie ------------------------------------------------------------------------

# Metadata value types: struct format of the scalars.
SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<B", 10: "<Q", 11: "<q", 12: "<d"}
HEADER_U64 = ["file_size", "metadata_offset", "metadata_len", "tensors_offset", "tensors_len", "tensor_count",
              "experts_offset", "experts_len", "data_offset", "data_len"]


@dataclass
class Item:
    """A dense tensor or an expert blob: its bytes, its dtype (for special values) and its table fields."""
    name: str
    offset: int
    size: int
    dtype: str  # "f32", "f16", "bf16" or "blob"
    crc_at: int
    fields: dict = field(default_factory=dict)  # field name -> (position, struct format)


@dataclass
class Layout:
    size: int
    header: dict  # name -> value
    meta_numbers: list  # (key, position, type code)
    meta_types: list  # (key, position of the type code)
    meta_strlens: list  # (key, position of a u64 length, the length)
    items: list  # Item
    expert_fields: list  # (name, position, format)
    sections: list  # (offset field, length field, crc position)


def parse_layout(b):
    """The seed's field positions (the seed is valid: no checks beyond what locating needs)."""
    u64 = lambda at: struct.unpack_from("<Q", b, at)[0]  # noqa: E731
    header = {name: u64(16 + 8 * i) for i, name in enumerate(HEADER_U64)}
    lay = Layout(len(b), header, [], [], [], [], [], [(24, 32, 96), (40, 48, 100), (64, 72, 104)])
    _parse_metadata(b, header["metadata_offset"], lay)
    _parse_tensors(b, header["tensors_offset"], header["tensor_count"], lay)
    _parse_experts(b, header["experts_offset"], lay)
    return lay


def _parse_metadata(b, at, lay):
    n = struct.unpack_from("<Q", b, at)[0]
    at += 8
    for _ in range(n):
        klen = struct.unpack_from("<Q", b, at)[0]
        lay.meta_strlens.append(("(key)", at, klen))
        key = b[at + 8:at + 8 + klen].decode()
        at += 8 + klen
        ty = struct.unpack_from("<I", b, at)[0]
        lay.meta_types.append((key, at))
        at = _skip_value(b, at + 4, ty, key, lay, top=True)


def _skip_value(b, at, ty, key, lay, top=False):
    if ty in SCALAR:
        if top and ty != 7:
            lay.meta_numbers.append((key, at, ty))
        return at + struct.calcsize(SCALAR[ty])
    if ty == 8:
        n = struct.unpack_from("<Q", b, at)[0]
        lay.meta_strlens.append((key, at, n))
        return at + 8 + n
    if ty == 9:
        elem, n = struct.unpack_from("<IQ", b, at)
        lay.meta_strlens.append((key + " (array count)", at + 4, n))
        at += 12
        for _ in range(n):
            at = _skip_value(b, at, elem, key, lay)
        return at
    raise ValueError(f"seed metadata: unknown type {ty} at '{key}'")


def _parse_tensors(b, at, count, lay):
    dtypes = {0: ("f32", 4), 1: ("f16", 2), 30: ("bf16", 2)}
    for _ in range(count):
        n = struct.unpack_from("<Q", b, at)[0]
        name = b[at + 8:at + 8 + n].decode()
        f = {"name length": (at, "<Q")}
        at += 8 + n
        dtype, ndim = struct.unpack_from("<II", b, at)
        f["dtype"], f["ndim"] = (at, "<I"), (at + 4, "<I")
        at += 8
        for d in range(ndim):
            f[f"dim {d}"] = (at + 8 * d, "<Q")
        at += 8 * ndim
        off, size, _crc = struct.unpack_from("<QQI", b, at)
        f["offset"], f["size"], f["crc32c"] = (at, "<Q"), (at + 8, "<Q"), (at + 16, "<I")
        lay.items.append(Item(f"tensor '{name}'", off, size, dtypes[dtype][0], at + 16, f))
        at += 20


def _parse_experts(b, at, lay):
    nl, ne, _hidden, _ffn, nv, _r = struct.unpack_from("<6I", b, at)
    for i, name in enumerate(["n_layers", "n_experts", "hidden", "ffn", "n_variants", "reserved"]):
        lay.expert_fields.append((f"expert table {name}", at + 4 * i, "<I"))
    at += 24
    for v in range(nv):
        lay.expert_fields.append((f"variant #{v} kind", at, "<I"))
        lay.expert_fields.append((f"variant #{v} group size", at + 4, "<I"))
        at += 16
    for r in range(nl * ne * nv):
        off, size, _crc, _res = struct.unpack_from("<QQII", b, at)
        le, v = divmod(r, nv)
        f = {"offset": (at, "<Q"), "size": (at + 8, "<Q"), "crc32c": (at + 16, "<I"), "reserved": (at + 20, "<I")}
        lay.items.append(Item(f"expert ({le // ne}, {le % ne}, #{v})", off, size, "blob", at + 16, f))
        at += 24


# --- Mutations ----------------------------------------------------------------------------------------------

U64_EXTREMES = [0, 1, 2**31, 2**32 - 1, 2**32, 2**63, 2**64 - 1, 2**64 - 4096]
U32_EXTREMES = [0, 1, 2, 3, 255, 2**16, 2**31, 2**32 - 1]
F32_EXTREMES = [1.4e-45, 0.0, -0.0, -1.0, float("nan"), float("inf"), float("-inf"), 3.4e38, 1e-38, 1e30, 1e-30]
F16_SPECIAL = [0x7E00, 0x7C00, 0xFC00, 0x7BFF, 0xFBFF]  # NaN, inf, -inf, max, -max
F32_SPECIAL = [0x7FC00000, 0x7F800000, 0xFF800000, 0x7F7FFFFF, 0xFF7FFFFF]


def put(buf, at, fmt, value):
    """Write value at `at` when it fits (a mutant may have been cut shorter); a float too large for
    the field becomes an infinity."""
    if at + struct.calcsize(fmt) > len(buf):
        return
    try:
        struct.pack_into(fmt, buf, at, value)
    except OverflowError:
        struct.pack_into(fmt, buf, at, float("inf") if value > 0 else float("-inf"))


def _extreme_for(fmt, old, rng):
    if fmt in ("<f", "<d"):
        return rng.choice(F32_EXTREMES + [old * 1e6, -old])
    bits = struct.calcsize(fmt) * 8
    signed = fmt.islower()
    lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)
    picks = [0, 1, -1, hi, hi - 1, lo, old + 1, old - 1, old * 2, old // 2, 2**31, 2**32]
    return min(hi, max(lo, rng.choice(picks)))


def m_flip(buf, lay, rng, lo=0, hi=None):
    hi = len(buf) if hi is None else min(hi, len(buf))
    if hi <= lo:
        return "flip (nothing in range)"
    at = rng.randrange(lo, hi)
    mask = rng.randrange(1, 256)
    buf[at] ^= mask
    return f"flip byte {at} ^ {mask:#04x}"


def m_flip_data(buf, lay, rng):
    return "data " + m_flip(buf, lay, rng, lay.header["data_offset"])


def m_flip_tables(buf, lay, rng):
    return "tables " + m_flip(buf, lay, rng, 0, lay.header["data_offset"])


def m_header(buf, lay, rng):
    i = rng.randrange(len(HEADER_U64))
    old = lay.header[HEADER_U64[i]]
    v = rng.choice(U64_EXTREMES + [old + 4096, max(0, old - 4096), old + 1, old * 2])
    put(buf, 16 + 8 * i, "<Q", v % 2**64)
    return f"header {HEADER_U64[i]} = {v}"


def m_meta_number(buf, lay, rng):
    key, at, ty = rng.choice(lay.meta_numbers)
    fmt = SCALAR[ty]
    old = struct.unpack_from(fmt, buf, at)[0] if at + struct.calcsize(fmt) <= len(buf) else 0
    v = _extreme_for(fmt, old, rng)
    put(buf, at, fmt, v)
    return f"metadata {key} = {v!r} (was {old!r})"


def m_meta_type(buf, lay, rng):
    key, at = rng.choice(lay.meta_types)
    v = rng.choice([0, 4, 5, 6, 7, 8, 9, 10, 12, 13, 255, 2**32 - 1])
    put(buf, at, "<I", v)
    return f"metadata {key} type code = {v}"


def m_meta_strlen(buf, lay, rng):
    key, at, n = rng.choice(lay.meta_strlens)
    v = rng.choice([0, 1, n - 1, n + 1, n * 2, 2**31, 2**63, 2**64 - 1]) % 2**64
    put(buf, at, "<Q", max(0, v))
    return f"metadata {key} length = {v} (was {n})"


def m_table_field(buf, lay, rng):
    it = rng.choice(lay.items)
    name, (at, fmt) = rng.choice(list(it.fields.items()))
    old = struct.unpack_from(fmt, buf, at)[0] if at + struct.calcsize(fmt) <= len(buf) else 0
    v = rng.choice(U64_EXTREMES + [old + 4096, old - 4096, old + 1] if fmt == "<Q" else U32_EXTREMES + [old + 1])
    v %= 2 ** (struct.calcsize(fmt) * 8)
    put(buf, at, fmt, v)
    return f"{it.name} {name} = {v} (was {old})"


def m_expert_field(buf, lay, rng):
    name, at, fmt = rng.choice(lay.expert_fields)
    v = rng.choice(U32_EXTREMES + [6, 16, 17, 64, 4096, 8192])
    put(buf, at, fmt, v)
    return f"{name} = {v}"


def m_special_values(buf, lay, rng):
    """NaN, inf or huge values written into a dense tensor or a blob (its CRC fixed by the reseal)."""
    it = rng.choice(lay.items)
    n = rng.choice([1, 1, 4, 64])
    if it.dtype == "f32":
        val, width, fmt = rng.choice(F32_SPECIAL), 4, "<I"
    else:  # f16 tensors and blob bytes (values, scales and mins are f16)
        val, width, fmt = rng.choice(F16_SPECIAL), 2, "<H"
    count = max(1, it.size // width)
    start = rng.randrange(count)
    for k in range(n):
        put(buf, it.offset + width * ((start + k) % count), fmt, val)
    return f"{it.name}: {n} value(s) from #{start} = {val:#x}"


def m_truncate(buf, lay, rng):
    h = lay.header
    cuts = [0, 1, 7, 8, 12, HEADER_SIZE - 1, HEADER_SIZE, h["metadata_offset"] + h["metadata_len"] // 2,
            h["tensors_offset"] + 3, h["experts_offset"] + 30, h["data_offset"], len(buf) - 1,
            rng.randrange(max(1, len(buf)))]
    n = max(0, rng.choice(cuts))
    del buf[n:]
    return f"truncate to {n}"


def m_extend(buf, lay, rng):
    n = rng.choice([1, 4096, 8192])
    buf.extend(bytes(rng.randrange(256) for _ in range(min(n, 64))) + bytes(max(0, n - 64)))
    return f"extend by {n}"


def m_copy(buf, lay, rng):
    n = rng.choice([8, 64, 4096])
    if len(buf) <= n:
        return "copy (too short)"
    src, dst = rng.randrange(len(buf) - n), rng.randrange(len(buf) - n)
    buf[dst:dst + n] = buf[src:src + n]
    return f"copy {n} bytes {src} -> {dst}"


MUTATIONS = [  # (name, function, weight)
    ("flip", m_flip, 3), ("flip data", m_flip_data, 4), ("flip tables", m_flip_tables, 4),
    ("header field", m_header, 2), ("metadata number", m_meta_number, 6), ("metadata type", m_meta_type, 1),
    ("metadata length", m_meta_strlen, 2), ("table field", m_table_field, 3), ("expert table", m_expert_field, 2),
    ("special values", m_special_values, 5), ("truncate", m_truncate, 1), ("extend", m_extend, 1),
    ("copy", m_copy, 1),
]


def reseal(buf, lay, level, seed):
    """Recompute CRCs so a mutant reaches the checks behind them: level "sections" (the three section CRCs
    and the header's), "all" (first the CRCs of every tensor and blob whose bytes differ from the seed's)."""
    if level == "all":
        for it in lay.items:
            a, z = it.offset, it.offset + it.size
            if z <= len(buf) and buf[a:z] != seed[a:z]:
                put(buf, it.crc_at, "<I", crc32c(buf[a:z]))
    if len(buf) < HEADER_SIZE:
        return
    for off_at, len_at, crc_at in lay.sections:
        off, n = struct.unpack_from("<QQ", buf, off_at)[0], struct.unpack_from("<Q", buf, len_at)[0]
        if off + n <= len(buf) and n <= 1 << 26:
            put(buf, crc_at, "<I", crc32c(buf[off:off + n]))
    put(buf, 252, "<I", crc32c(buf[:252]))


def mutate(seed, lay, rng):
    buf = bytearray(seed)
    names, steps = [], []
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        name, fn, _w = rng.choices(MUTATIONS, weights=[w for _, _, w in MUTATIONS])[0]
        names.append(name)
        steps.append(fn(buf, lay, rng))
    level = rng.choices(["raw", "sections", "all"], weights=[2, 3, 5])[0]
    reseal(buf, lay, level, seed)
    return bytes(buf), names, f"{'; '.join(steps)} [reseal: {level}]"


# --- Running and classifying ----------------------------------------------------------------------------------

def commands(text):
    return {
        "inspect": ["inspect", "{m}"],
        "inspect --verify": ["inspect", "--verify", "{m}"],
        "run": ["run", "-m", "{m}", "-p", "hi", "-n", "4", "--temp", "0", "--device", "cpu"],
        "perplexity": ["perplexity", "-m", "{m}", "-f", text, "-c", "16", "--device", "cpu"],
        "bench": ["bench", "-m", "{m}", "-p", "8", "-n", "4", "-r", "1", "--device", "cpu"],
    }


def classify(rc, stderr, path):
    """(outcome, the line that decided it)."""
    if rc is None:
        return "hang", ""
    if rc < 0:
        return "signal", signal.Signals(-rc).name if -rc in signal.valid_signals() else str(rc)
    panic = next((ln for ln in stderr.splitlines() if "panicked" in ln), None)
    if rc == 101 or panic:
        return "panic", panic or f"exit {rc}"
    if rc == 0:
        return "ok", ""
    errors = [ln for ln in stderr.splitlines() if ln.startswith("error:")]
    line = errors[-1] if errors else (stderr.strip().splitlines() or [""])[-1]
    if rc != 1:
        return "odd exit", f"exit {rc}: {line}"
    return ("clean error" if path in line else "unnamed error"), line


def signature(outcome, cmd, line, path):
    s = line.replace(path, "FILE")
    s = re.sub(r"panicked at ([^:]+:\d+)", r"panicked at \1", s)
    s = re.sub(r"\d+(\.\d+)?(e[-+]?\d+)?", "N", s)
    return f"{outcome} | {cmd} | {s[:160]}"


def run_case(hob, argv, path, timeout):
    try:
        p = subprocess.run([hob] + [a.replace("{m}", path) for a in argv], stdin=subprocess.DEVNULL,
                           capture_output=True, timeout=timeout)
        return p.returncode, p.stderr.decode("utf-8", "replace")
    except subprocess.TimeoutExpired as e:
        return None, (e.stderr or b"").decode("utf-8", "replace")


class Fuzzer:
    def __init__(self, args, seed, lay, text, out):
        self.args, self.seed, self.lay, self.out = args, seed, lay, out
        self.cmds = commands(text)
        self.lock = threading.Lock()
        self.outcomes, self.by_cmd, self.by_kind = Counter(), Counter(), Counter()
        self.signatures, self.saved, self.clean = Counter(), 0, Counter()
        self.mutants = 0
        self.bugs = 0  # mutants this script failed to make
        self.work = tempfile.mkdtemp(prefix="fuzz_hob-")

    def worker(self, wid, deadline, max_cases):
        path = os.path.join(self.work, f"mutant-{wid}.hob")
        n = 0
        while time.monotonic() < deadline:
            with self.lock:
                if max_cases and self.mutants * len(self.cmds) >= max_cases:
                    return
                index = self.mutants
                self.mutants += 1
            rng = random.Random(self.args.rng_seed * 1_000_003 + index)
            try:
                data, kinds, desc = mutate(self.seed, self.lay, rng)
            except Exception:  # a bug of this script: reported, the run goes on
                with self.lock:
                    self.bugs += 1
                    if self.bugs == 1:
                        traceback.print_exc()
                continue
            with open(path, "wb") as f:
                f.write(data)
            for name, argv in self.cmds.items():
                rc, stderr = run_case(self.args.hob, argv, path, self.args.timeout)
                outcome, line = classify(rc, stderr, path)
                self.record(index, kinds, desc, name, argv, (outcome, line, stderr), data, path)
            n += 1

    def record(self, index, kinds, desc, name, argv, result, data, path):
        outcome, line, stderr = result
        with self.lock:
            self.outcomes[outcome] += 1
            self.by_cmd[(name, outcome)] += 1
            for k in set(kinds):
                self.by_kind[(k, outcome)] += 1
            if outcome == "clean error":
                self.clean[signature("", name, line, path).split(" | ", 2)[2]] += 1
            if outcome not in FAILURES:
                return
            sig = signature(outcome, name, line, path)
            self.signatures[sig] += 1
            if self.signatures[sig] > self.args.save_per_signature:
                return
            self.saved += 1
            case = os.path.join(self.out, "failures", f"{outcome.replace(' ', '-')}-{self.saved:04d}")
        os.makedirs(case, exist_ok=True)
        with open(os.path.join(case, "mutant.hob"), "wb") as f:
            f.write(data)
        cmd = " ".join([self.args.hob] + [a.replace("{m}", "mutant.hob") for a in argv])
        with open(os.path.join(case, "case.txt"), "w") as f:
            f.write(f"outcome: {outcome}\nmutant #{index} (--rng-seed {self.args.rng_seed})\n"
                    f"mutation: {desc}\ncommand (in this directory): {cmd}\n\n{stderr.replace(path, 'mutant.hob')}")

    def summary(self, minutes):
        cases = sum(self.outcomes.values())
        failed = sum(self.outcomes[o] for o in FAILURES)
        lines = [f"fuzz_hob: {cases:,} cases ({self.mutants:,} mutants x {len(self.cmds)} commands) in "
                 f"{minutes:.1f} minutes, {self.args.jobs} jobs, rng seed {self.args.rng_seed}",
                 f"binary {self.args.hob}; seed {self.args.seed_file} ({len(self.seed):,} bytes)", "outcomes:"]
        lines += [f"  {o:<14}{self.outcomes[o]:>8,}" for o in OUTCOMES]
        lines.append("per command (ok / clean error / failures):")
        for name in self.cmds:
            ok, clean = self.by_cmd[(name, "ok")], self.by_cmd[(name, "clean error")]
            bad = sum(self.by_cmd[(name, o)] for o in FAILURES)
            lines.append(f"  {name:<18}{ok:>7,} {clean:>7,} {bad:>7,}")
        lines.append("per mutation (cases: ok / clean error / failures):")
        for k, _f, _w in MUTATIONS:
            ok, clean = self.by_kind[(k, "ok")], self.by_kind[(k, "clean error")]
            bad = sum(self.by_kind[(k, o)] for o in FAILURES)
            lines.append(f"  {k:<18}{ok:>7,} {clean:>7,} {bad:>7,}")
        if self.bugs:
            lines.append(f"fuzz_hob bugs: {self.bugs} mutants not made (traceback above)")
        lines.append(f"distinct clean errors: {len(self.clean)}; the most common:")
        lines += [f"  {n:>6,}  {s}" for s, n in self.clean.most_common(12)]
        if failed:
            lines.append(f"FAILED: {failed:,} cases, {len(self.signatures)} distinct; saved under "
                         f"{os.path.join(self.out, 'failures')}:")
            lines += [f"  {n:>6,}  {s}" for s, n in self.signatures.most_common(40)]
        else:
            lines.append("no failures: no panic, no hang, no crash, every rejection names the file")
        return "\n".join(lines)


def build_seed(hob, out):
    path = os.path.join(out, "seed.hob")
    subprocess.run([hob, "convert", "--from", FIXTURE, "-o", path, "--experts", "f16,int4", "--no-progress"],
                   check=True, capture_output=True)
    return path


def write_text(out):
    words = ("the quick brown fox jumps over the lazy dog to be or not to be that is the question whether "
             "tis nobler in the mind to suffer the slings and arrows of outrageous fortune").split()
    rng = random.Random(7)
    path = os.path.join(out, "text.txt")
    with open(path, "w") as f:
        f.write(" ".join(rng.choice(words) for _ in range(200)) + "\n")
    return path


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hob", default=os.path.join(ROOT, "target", "release", "hob"), help="the hob binary")
    ap.add_argument("--seed-file", help="the .hob to mutate (default: the tiny fixture, converted)")
    ap.add_argument("--minutes", type=float, default=1.0, help="time budget (default 1)")
    ap.add_argument("--cases", type=int, default=0, help="stop after about this many cases (0: the budget only)")
    ap.add_argument("--jobs", type=int, default=2, help="mutants run at once (default 2)")
    ap.add_argument("--timeout", type=float, default=20.0, help="seconds a command may run (default 20)")
    ap.add_argument("--out", default=os.path.join(ROOT, "target", "fuzz-out"),
                    help="where failures and the summary go (default target/fuzz-out)")
    ap.add_argument("--rng-seed", type=int, default=1, help="mutant i uses Random(seed * 1000003 + i)")
    ap.add_argument("--save-per-signature", type=int, default=3, help="failing cases kept per distinct failure")
    args = ap.parse_args(argv)
    args.hob = os.path.abspath(args.hob)
    if not os.access(args.hob, os.X_OK):
        sys.exit(f"fuzz_hob: no hob binary at {args.hob} (cargo build --release, or --hob)")
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    args.seed_file = os.path.abspath(args.seed_file) if args.seed_file else build_seed(args.hob, out)
    with open(args.seed_file, "rb") as f:
        seed = f.read()
    fz = Fuzzer(args, seed, parse_layout(seed), write_text(out), out)
    for name, cmd in fz.cmds.items():
        rc, stderr = run_case(args.hob, cmd, args.seed_file, args.timeout)
        if rc != 0:
            sys.exit(f"fuzz_hob: the undamaged seed fails `{name}` (exit {rc}):\n{stderr}")
    started = time.monotonic()
    deadline = started + args.minutes * 60
    try:
        with ThreadPoolExecutor(args.jobs) as pool:
            for f in [pool.submit(fz.worker, w, deadline, args.cases) for w in range(args.jobs)]:
                f.result()
    finally:
        shutil.rmtree(fz.work, ignore_errors=True)
    text = fz.summary((time.monotonic() - started) / 60)
    print(text)
    with open(os.path.join(out, "summary.txt"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(out, "signatures.txt"), "w") as f:
        f.writelines(f"{n:>8}  {s}\n" for s, n in fz.signatures.most_common())
    return 1 if any(fz.outcomes[o] for o in FAILURES) else 0


if __name__ == "__main__":
    sys.exit(main())
