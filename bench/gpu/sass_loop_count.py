#!/usr/bin/env python3
"""Static SASS instruction counts of a kernel's loops, for the decode GEMV's cost model.

  cuobjdump -sass OBJ > k.sass
  bench/gpu/sass_loop_count.py k.sass 'QgemvMx4ColKernel<2, 2, true, false>'
      lists the kernel's loops (a BRA to a lower address): static size and opcode histogram
  bench/gpu/sass_loop_count.py k.sass 'NAME' 0xLOOPHEAD [0xTAKEN ...]
      counts one trip through the loop starting at LOOPHEAD along one path: fall-through,
      unconditional BRAs, the conditional BRAs at the listed addresses taken, the others and
      BRA.DIV (warp-divergence handlers) not; stops at the loop's backward branch.

NAME is a substring of the demangled kernel name. Why a path count: the GEMV's full-batch
loop holds both sides of its per-batch scale vote (fast and general decode), and only one
runs per trip; instructions per weight per lane = path count / weights a lane decodes per
trip (U steps x WR x 2 rows x 32 for the 4-bit single-chunk formats).
"""
import collections
import re
import subprocess
import sys


def Kernels(sass):
  for f in re.split(r'\n\s*Function : ', sass)[1:]:
    name = f.split('\n', 1)[0].strip()
    dem = subprocess.run(['c++filt'], input=name, capture_output=True, text=True).stdout.strip()
    dem = re.sub(r'ring::cuda::(internal::\(anonymous namespace\)|qdec)::', '', dem)
    insts = []
    for line in f.split('\n'):
      m = re.match(r'\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;', line)
      if m:
        insts.append((int(m.group(1), 16), m.group(2).strip()))
    yield dem, insts


def Histogram(texts):
  ops = collections.Counter(re.sub(r'^@!?U?P\w+\s+', '', t).split()[0].split('.')[0] for t in texts)
  return ' '.join('%s:%d' % kv for kv in sorted(ops.items(), key=lambda kv: -kv[1]))


def Target(text):
  m = re.search(r'\bBRA\s+(0x[0-9a-f]+)', text)
  return int(m.group(1), 16) if m and 'BRA.DIV' not in text else None


def main():
  sass = open(sys.argv[1]).read()
  want = sys.argv[2]
  head = int(sys.argv[3], 16) if len(sys.argv) > 3 else None
  taken = {int(a, 16) for a in sys.argv[4:]}
  for dem, insts in Kernels(sass):
    if want not in dem:
      continue
    idx = {a: i for i, (a, _) in enumerate(insts)}
    print('==', dem, len(insts), 'instructions')
    for i, (a, t) in enumerate(insts):
      tgt = Target(t)
      if tgt is None or tgt > a:
        continue
      if head is None:
        body = [x for _, x in insts[idx[tgt]:i + 1]]
        print('  loop 0x%x..0x%x: %d static' % (tgt, a, len(body)))
        print('   ', Histogram(body))
      elif tgt == head:
        j, path = idx[head], []
        while True:
          ad, tx = insts[j]
          path.append(tx)
          if ad == a:
            break
          nxt = Target(tx)
          if nxt is not None and (not tx.startswith('@') or ad in taken):
            j = idx[nxt]
          else:
            j += 1
        print('  path 0x%x..0x%x taking %s: %d instructions' %
              (head, a, ' '.join(hex(x) for x in sorted(taken)) or '-', len(path)))
        print('   ', Histogram(path))
        return


if __name__ == '__main__':
  main()
