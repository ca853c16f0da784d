#!/usr/bin/env python3
"""Write the damaged cubin that makes libnvJitLink (and the real nvlink) segfault:
   crash-cubin.py SCALE_CUBIN OUT
SCALE_CUBIN is the test corpus's scale.cubin (sm_90); OUT gets it with byte 2 of
its .nv.callgraph section XOR 0x10, the same input tests/tests/workers.rs builds.
Used as a fuzz seed of the input readers (scripts/fuzz.sh)."""
import struct
import sys

data = bytearray(open(sys.argv[1], "rb").read())
shoff, = struct.unpack_from("<Q", data, 0x28)
shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
def sh(i):
    return struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
strtab_off = sh(shstrndx)[4]
for i in range(shnum):
    name_off, _, _, _, off, _, _, _, _, _ = sh(i)
    end = data.index(b"\0", strtab_off + name_off)
    if data[strtab_off + name_off:end] == b".nv.callgraph":
        data[off + 2] ^= 0x10
        open(sys.argv[2], "wb").write(data)
        break
else:
    sys.exit("no .nv.callgraph section")
