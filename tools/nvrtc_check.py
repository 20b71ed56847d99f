#!/usr/bin/env python3
"""Compile cuda/kernels.cu with NVRTC on a machine without a GPU: compile errors, and ptxas's spill report.

    python3 tools/nvrtc_check.py [--arch sm_90 sm_89 sm_87] [-D NAME=VALUE ...] [-v]

NVRTC comes from the nvidia-cuda-nvrtc-cu12 wheel (PyPI), downloaded once into ~/.cache/hob-nvrtc; nothing is
installed. Exit status 1 if any architecture fails to compile. -v prints ptxas's full report (registers per kernel).
"""
import argparse, ctypes, glob, os, subprocess, sys, zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.path.expanduser("~/.cache/hob-nvrtc")


def libnvrtc():
    found = glob.glob(f"{CACHE}/nvidia/cuda_nvrtc/lib/libnvrtc.so.*")
    if not found:
        os.makedirs(CACHE, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", CACHE,
                        "nvidia-cuda-nvrtc-cu12"], check=True)
        for whl in glob.glob(f"{CACHE}/*.whl"):
            zipfile.ZipFile(whl).extractall(CACHE)
        found = glob.glob(f"{CACHE}/nvidia/cuda_nvrtc/lib/libnvrtc.so.*")
    return ctypes.CDLL(sorted(p for p in found if "alt" not in p)[0])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", nargs="+", default=["sm_90", "sm_89", "sm_87"])
    ap.add_argument("--source", default=os.path.join(ROOT, "cuda", "kernels.cu"))
    ap.add_argument("-D", dest="defines", action="append", default=[],
                    help="a macro for the source, as HOB_NVRTC_DEFINES passes them (repeatable)")
    ap.add_argument("-v", action="store_true", help="print ptxas's whole report")
    a = ap.parse_args()
    lib, src, failed = libnvrtc(), open(a.source, "rb").read(), False
    for arch in a.arch:
        prog = ctypes.c_void_p()
        if lib.nvrtcCreateProgram(ctypes.byref(prog), src, b"kernels.cu", 0, None, None) != 0:
            sys.exit("nvrtcCreateProgram failed")
        opts = [f"--gpu-architecture={arch}".encode(), b"-std=c++17", b"-Xptxas", b"-v"]
        opts += [f"-D{d}".encode() for d in a.defines]
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
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
