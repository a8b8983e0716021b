"""One fleet run under ``perf record`` with numba's compiled code named (issue 30).

``perf`` samples numba's machine code as anonymous addresses: the code is loaded from numba's
cache as object files into JIT memory, with no symbols perf can read. This script keeps every
object numba loads or compiles (numba's object-code hooks, patched before any compilation),
reads each one's function symbols (ELF64 symtab: name, size) and asks numba's JIT engine for
their addresses, then writes ``/tmp/perf-<pid>.map`` -- the file perf reads for JIT code --
once after the build and again after the run (kernels loaded during the run included), with
the mangled names shortened to ``module.function``. It prints the run's window in
CLOCK_MONOTONIC seconds, so the report can be cut to ``env.run()`` alone::

    perf record -k CLOCK_MONOTONIC -F 1999 -e cpu-clock -o fleet.data \\
        python benchmarks/perf_map.py 1024 least-tokens 200000
    perf report -i fleet.data --time <window printed> --sort sym --stdio

(arguments as ``benchmarks/fleet.py --one``: replicas, router or ``lone``, requests; the rate is
8.5 req/s per replica). How benchmarks/RESULTS.md found the meminfo reference counts of a
1,024-replica fleet (2026-12-05, sixth session).
"""

from __future__ import annotations

import os
import struct
import sys
import time
from pathlib import Path

from numba.core import codegen as cg

REPO = Path(__file__).resolve().parents[1]
BUFS: list[bytes] = []
_get = cg.CPUCodeLibrary._object_getbuffer_hook.__func__
_done = cg.CPUCodeLibrary._object_compiled_hook.__func__


def _keep_loaded(cls, ll_module):
    buf = _get(cls, ll_module)
    if buf:
        BUFS.append(bytes(buf))
    return buf


def _keep_compiled(cls, ll_module, buf):
    BUFS.append(bytes(buf))
    return _done(cls, ll_module, buf)


# (numba's JIT engine takes these hooks when it is created: patched before anything compiles)
cg.CPUCodeLibrary._object_getbuffer_hook = classmethod(_keep_loaded)
cg.CPUCodeLibrary._object_compiled_hook = classmethod(_keep_compiled)


def elf_functions(buf: bytes) -> list[tuple[str, int]]:
    """(name, size) of the defined function symbols of an ELF64 little-endian object."""
    shoff = struct.unpack_from("<Q", buf, 0x28)[0]
    shentsize, shnum = struct.unpack_from("<HH", buf, 0x3A)
    secs = [struct.unpack_from("<IIQQQQIIQQ", buf, shoff + i * shentsize) for i in range(shnum)]
    out = []
    for _name, typ, _flags, _addr, off, size, link, _info, _align, entsize in secs:
        if typ != 2:  # SHT_SYMTAB
            continue
        strtab = secs[link][4]
        for j in range(size // entsize):
            nm, info, _other, shndx, _val, sz = struct.unpack_from("<IBBHQQ", buf, off + j * entsize)
            if info & 0xF == 2 and shndx != 0 and sz:  # STT_FUNC, defined
                end = buf.index(b"\0", strtab + nm)
                out.append((buf[strtab + nm:end].decode(), sz))
    return out


def short(name: str) -> str:
    """``servesim.engine.kernel.advance`` for numba's mangled ``_ZN8servesim6engine6kernel7advanceB...``."""
    if not name.startswith("_ZN"):
        return name[:80]
    i, parts = 3, []
    while i < len(name) and name[i].isdigit():
        j = i
        while name[j].isdigit():
            j += 1
        n = int(name[i:j])
        parts.append(name[j:j + n])
        i = j + n
    return ".".join(parts)[:100] or name[:80]


def write_map() -> int:
    from numba.core.registry import cpu_target

    engine = cpu_target.target_context.codegen()._engine
    at: dict[int, tuple[int, str]] = {}
    for buf in BUFS:
        for name, size in elf_functions(buf):
            try:
                a = engine.get_function_address(name)
            except Exception:  # noqa: BLE001 - (a symbol of an object not added to the engine)
                continue
            if a:
                at[a] = (size, short(name))
    with open(f"/tmp/perf-{os.getpid()}.map", "w") as f:
        for a, (size, name) in sorted(at.items()):
            f.write(f"{a:x} {size:x} {name}\n")
    return len(at)


def main() -> None:
    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(REPO / "benchmarks"))
    import fleet

    from servesim import scenario_from_dict
    from servesim.simulate import build

    n, router, requests = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    b = build(scenario_from_dict(fleet.scenario(n, requests, None if router == "lone" else router, 8.5)))
    write_map()
    m0, t0 = time.clock_gettime(time.CLOCK_MONOTONIC), time.perf_counter()
    b.env.run()
    m1, t1 = time.clock_gettime(time.CLOCK_MONOTONIC), time.perf_counter()
    print(f"run {t1 - t0:.2f} s; perf window {m0:.6f},{m1:.6f}; {write_map()} functions in /tmp/perf-{os.getpid()}.map")


if __name__ == "__main__":
    main()
