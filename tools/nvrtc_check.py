#!/usr/bin/env python3
"""Compile hob's kernels (cuda/*.cu) with NVRTC on a machine without a GPU: compile errors, and ptxas's spill report.

    python3 tools/nvrtc_check.py [--arch sm_90 sm_89 sm_87] [-D NAME=VALUE ...] [-v]
    python3 tools/nvrtc_check.py --arch sm_90 --sass matvec_qd_int2 [-D NAME=VALUE ...]

NVRTC comes from the nvidia-cuda-nvrtc-cu12 wheel (PyPI), downloaded once into ~/.cache/hob-nvrtc; nothing is
installed. Exit status 1 if any architecture fails to compile. -v prints ptxas's full report (registers per kernel).

The source is cuda/*.cu concatenated in the order of src/backend/cuda/kernels.rs (Kernels::SOURCE), or --source
FILE. Every architecture compiles with the macros hob's loader passes there (src/backend/cuda/kernels.rs
Kernels::nvrtc_options: x's planes, the dp4a rings); -D overrides one for an experiment.

--sass KERNEL: that kernel's machine code for each --arch (cuobjdump and nvdisasm from PyPI's nvidia-cuda-cuobjdump
and nvidia-cuda-nvdisasm wheels, into the same cache), then a summary: static instructions by opcode and each loop
around all of the kernel's dp4a (else mma, else FFMA) instructions (its body's size and mix). What runs is counted
on the device (Nsight Compute's SourceCounters: benches/results/2026-11-28-h200-decode-knobs.md section 7).
"""
import argparse, ctypes, glob, os, re, subprocess, sys, zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.path.expanduser("~/.cache/hob-nvrtc")


def from_wheel(pattern, wheel, into=CACHE):
    """The files matching `pattern` under `into`, after downloading and unpacking `wheel` (PyPI) there once."""
    found = glob.glob(f"{into}/{pattern}")
    if not found:
        os.makedirs(into, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", into, wheel], check=True)
        for whl in glob.glob(f"{into}/*.whl"):
            zipfile.ZipFile(whl).extractall(into)
        found = glob.glob(f"{into}/{pattern}")
    if not found:
        sys.exit(f"{wheel} has no {pattern}")
    return found


def libnvrtc():
    found = from_wheel("nvidia/cuda_nvrtc/lib/libnvrtc.so.*", "nvidia-cuda-nvrtc-cu12")
    return ctypes.CDLL(sorted(p for p in found if "alt" not in p)[0])


def tool(name, wheel):
    """A CUDA binary tool from a PyPI wheel (its own folder of the cache: not NVRTC's)."""
    path = from_wheel(f"nvidia/*/bin/{name}", wheel, f"{CACHE}/tools")[0]
    os.chmod(path, 0o755)
    return path


def kernel_source():
    """cuda/*.cu concatenated as Kernels::SOURCE concatenates them (kernels.rs's include_str! order)."""
    rs = open(os.path.join(ROOT, "src", "backend", "cuda", "kernels.rs")).read()
    names = re.findall(r'include_str!\("\.\./\.\./\.\./cuda/([\w.]+\.cu)"\)', rs)
    if not names:
        sys.exit("no cuda/*.cu found in src/backend/cuda/kernels.rs")
    return b"".join(open(os.path.join(ROOT, "cuda", n), "rb").read() for n in names)


def loader_defines(arch):
    """The macros hob's kernel loader passes on `arch` (kernels.rs Kernels::nvrtc_options, qd_ring)."""
    major = int(arch.split("_")[1]) // 10
    ring = [0, 4, 3, 3] if major >= 9 else [0, 0, 0, 0]
    return ["QD_PARTS=2"] + [f"QD_RING_{k}={v}" for k, v in zip(["INT8", "INT4", "INT2", "INT3"], ring)]


def summarize(sass):
    """Static opcode counts, and the loops around every dp4a (else mma, else FFMA) of the kernel."""
    import collections, re
    ops = []
    for line in sass.splitlines():
        m = re.search(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)\s*(.*?);", line)
        if m:
            ops.append((int(m.group(1), 16), m.group(3).split(".")[0], m.group(4)))
    if not ops:
        return
    count = collections.Counter(o[1] for o in ops)
    print(f"{len(ops)} instructions: " + ", ".join(f"{k} {v}" for k, v in count.most_common(16)))
    hot = next((k for k in ("IDP", "IMMA", "HMMA", "FFMA") if count[k]), None)
    at = {a: i for i, (a, _, _) in enumerate(ops)}
    idx = [i for i, o in enumerate(ops) if o[1] == hot]
    if not idx:
        return
    for i, (a, op, args) in enumerate(ops):
        m = re.search(r"0x([0-9a-f]+)", args) if op == "BRA" else None
        t = int(m.group(1), 16) if m else None
        if t in at and at[t] <= idx[0] and i >= idx[-1]:
            body = collections.Counter(o[1] for o in ops[at[t]:i + 1])
            print(f"loop {t:#x}..{a:#x} around every {hot}: {i - at[t] + 1} instructions: "
                  + ", ".join(f"{k} {v}" for k, v in body.most_common(12)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", nargs="+", default=["sm_90", "sm_89", "sm_87"])
    ap.add_argument("--source", help="compile this file instead of cuda/*.cu")
    ap.add_argument("-D", dest="defines", action="append", default=[],
                    help="a macro for the source, in place of the loader's value (repeatable)")
    ap.add_argument("-v", action="store_true", help="print ptxas's whole report")
    ap.add_argument("--sass", metavar="KERNEL", help="print that kernel's machine code and a summary")
    a = ap.parse_args()
    src = open(a.source, "rb").read() if a.source else kernel_source()
    lib, failed = libnvrtc(), False
    for arch in a.arch:
        prog = ctypes.c_void_p()
        if lib.nvrtcCreateProgram(ctypes.byref(prog), src, b"kernels.cu", 0, None, None) != 0:
            sys.exit("nvrtcCreateProgram failed")
        opts = [f"--gpu-architecture={arch}".encode(), b"-std=c++17", b"-Xptxas", b"-v"]
        defines = list(a.defines)
        mine = {d.split("=")[0] for d in defines}
        defines += [d for d in loader_defines(arch) if d.split("=")[0] not in mine]
        opts += [f"-D{d}".encode() for d in defines]
        rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
        n = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
        log = ctypes.create_string_buffer(n.value)
        lib.nvrtcGetProgramLog(prog, log)
        lines = log.value.decode(errors="replace").splitlines()
        print(f"== {arch}: {'ok' if rc == 0 else 'FAILED'}")
        if rc != 0 or a.v:
            print("\n".join(lines))
        else:
            for prev, line in zip(lines, lines[1:]):
                if "spill stores" in line and " 0 bytes spill stores" not in line:
                    print(prev.strip(), "|", line.strip())
        failed |= rc != 0
        if a.sass and rc == 0:
            n = ctypes.c_size_t()
            lib.nvrtcGetCUBINSize(prog, ctypes.byref(n))
            cubin = ctypes.create_string_buffer(n.value)
            lib.nvrtcGetCUBIN(prog, cubin)
            path = f"{CACHE}/kernels-{arch}.cubin"
            with open(path, "wb") as f:
                f.write(cubin.raw)
            nvdisasm = tool("nvdisasm", "nvidia-cuda-nvdisasm")
            cuobjdump = tool("cuobjdump", "nvidia-cuda-cuobjdump")
            env = dict(os.environ, PATH=os.path.dirname(nvdisasm) + os.pathsep + os.environ.get("PATH", ""))
            out = subprocess.run([cuobjdump, "-sass", "-fun", a.sass, path], env=env, capture_output=True,
                                 text=True)
            print(out.stdout + out.stderr)
            summarize(out.stdout)
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
