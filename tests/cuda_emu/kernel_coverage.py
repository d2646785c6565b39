# Which CUDA kernels the emulator's tests never run: reads gcov's counts of the rewritten cuda/
# sources (a build with COV=--coverage, after its tests ran: run.sh does both) and prints every
# __global__ kernel, and every template instance of one, whose body never ran.
# Usage: kernel_coverage.py BUILD_DIR [--require-every-kernel]   (BUILD_DIR: src/cuda and obj/cu
# under it). A kernel no test runs is one no test compares with the CPU path: with the flag, one
# fails the run. An instance never run is a dtype, tile size or policy of a kernel that no test
# takes (or code a dispatch instantiates that nothing reaches): listed, not failed.
import glob
import os
import re
import subprocess
import sys

build = sys.argv[1]
objdir = os.path.join(build, 'obj', 'cu')
srcdir = os.path.join(build, 'src', 'cuda')
if not glob.glob(os.path.join(objdir, '*.gcda')):
    sys.exit('kernel_coverage: no counts (*.gcda) under %s: build with COV=--coverage and run the tests first' % objdir)

# gcov's text of every object: per function instance (a mangled name line, then "count: line:
# source" lines; "#####" = never run, "-" = no code).
text = []
for obj in sorted(glob.glob(os.path.join(objdir, '*.o'))):
    text += subprocess.run(['gcov', '-t', '-o', objdir, obj], capture_output=True, text=True,
                           cwd=objdir).stdout.splitlines()
runs, first_line, line_hits = {}, {}, {}
inst, source = None, None
for line in text:
    s = line.strip()
    if s.startswith('-----'):  # ends an instance's block: the file's own listing, or the next instance
        inst = None
        continue
    if s.startswith('_Z') and s.endswith(':'):
        inst = s[:-1]
        runs.setdefault(inst, False)
        first_line.setdefault(inst, None)
        continue
    m = re.match(r'\s*([^:]+):\s*(\d+):(.*)', line)
    if not m:
        continue
    count, num, code = m.group(1).strip().rstrip('*'), int(m.group(2)), m.group(3)
    if num == 0 and code.startswith('Source:'):
        source, inst = os.path.basename(code[len('Source:'):]), None
        continue
    ran = count not in ('-', '#####', '=====', '')
    if inst is not None:
        if first_line[inst] is None:
            first_line[inst] = code
        runs[inst] = runs[inst] or ran
    elif source is not None and count != '-':
        line_hits[(source, num)] = line_hits.get((source, num), False) or ran

# Kernels by name: the line span of each __global__ body in the rewritten sources.
never_kernels, kernels = [], 0
for path in sorted(glob.glob(os.path.join(srcdir, '*.cpp')) + glob.glob(os.path.join(srcdir, '*.cuh'))):
    s, base = open(path).read(), os.path.basename(path)
    for m in re.finditer(r'__global__\s+(?:__launch_bounds__\([^)]*\)\s*)?void\s+(\w+)\s*\(', s):
        open_at = s.index('{', m.end())
        depth, close_at = 0, open_at
        for close_at in range(open_at, len(s)):
            depth += {'{': 1, '}': -1}.get(s[close_at], 0)
            if depth == 0:
                break
        a, z = s.count('\n', 0, open_at) + 1, s.count('\n', 0, close_at) + 1
        kernels += 1
        if not any(line_hits.get((base, n), False) for n in range(a, z + 1)):
            never_kernels.append('%s: %s (line %d)' % (base, m.group(1), a))

kernel_insts = [k for k in runs if first_line[k] and '__global__' in first_line[k]]
never_insts = sorted(k for k in kernel_insts if not runs[k])
names = subprocess.run(['c++filt'], input='\n'.join(never_insts), capture_output=True, text=True).stdout.splitlines()
print('kernels: %d, never run: %d' % (kernels, len(never_kernels)))
for k in never_kernels:
    print('  ' + k)
print('kernel template instances: %d, never run: %d' % (len(kernel_insts), len(never_insts)))
for n in names:
    n = n.replace('linea::cuda::', '').replace('(anonymous namespace)::', '').replace('detail::', '')
    print('  ' + (n[:n.find('>(') + 1] if '>(' in n else n))
if never_kernels and '--require-every-kernel' in sys.argv[2:]:
    sys.exit('kernel_coverage: %d kernel(s) no emulator test runs (above): add a parity test' % len(never_kernels))
