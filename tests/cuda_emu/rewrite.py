# Copies cuda/*.cu and cuda/*.cuh to OUT/cuda/ (.cu -> .cpp), turning every kernel launch
#   kernel<...><<<grid, block, smem, stream>>>(args)  into  emu::launch(kernel<...>, grid, block, smem, stream)(args)
# so that g++ can compile them against emu_prelude.h. Usage: rewrite.py REPO_ROOT OUT_DIR
import glob, os, re, sys
root, out = sys.argv[1], sys.argv[2]
# White space may separate the kernel name from <<< (clang-format breaks long launches there).
pat = re.compile(r'([A-Za-z_][\w:]*(?:<[^<>;]*>)?)\s*<<<(.*?)>>>\(', re.S)
os.makedirs(os.path.join(out, 'cuda'), exist_ok=True)
# A static __shared__ array would compile here as each emulated thread's own local array (g++
# ignores the attribute), so a block's threads would not share it: kernels take their shared
# memory from the launch (shared_mem<T>(), cuda/common.cuh), and a static one is refused here.
static_shared = re.compile(r'^(?!\s*//)(?!.*\bextern\b).*\b__shared__\b', re.M)
for f in sorted(glob.glob(os.path.join(root, 'cuda', '*.cu')) + glob.glob(os.path.join(root, 'cuda', '*.cuh'))):
    for m in static_shared.finditer(open(f).read()):
        line = open(f).read().count('\n', 0, m.start()) + 1
        sys.exit(f'{f}:{line}: a static __shared__ array; take shared memory from the launch (shared_mem<T>()): '
                 'the emulator cannot share a static one between a block\'s threads')
    s = pat.sub(lambda m: 'emu::launch(' + m.group(1) + ', ' + m.group(2) + ')(', open(f).read())
    base = os.path.basename(f)
    dst = os.path.join(out, 'cuda', base[:-3] + '.cpp' if base.endswith('.cu') else base)
    if not os.path.exists(dst) or open(dst).read() != s:
        open(dst, 'w').write(s)
