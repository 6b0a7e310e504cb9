#!/usr/bin/env python3
"""The include-direction check: every `#include "peakbound/<dir>/..."` in src/peakbound
points down the order written once in docs/design.md (the fenced block marked `layers`).

The block lists the levels bottom to top, one per line; folders on the same line are
peers and may not include each other. A folder may include itself and any folder on a
lower line. A line `private DIR: USER USER ...` makes DIR (kernels/cpu, kernels/cuda)
reachable only from the listed folders (and from itself). Every folder of src/peakbound
must be placed, so a new folder is a decision, not an accident.

  check_layers.py [--root REPO]   exit 0 when every include points down, 1 otherwise
  check_layers.py --self-test     copies the tree, plants an upward include and an include
                                  past ops, and exits 0 only if the check fails on both

Python 3 standard library only.
"""
import argparse
import pathlib
import re
import shutil
import sys
import tempfile

INCLUDE = re.compile(r'^\s*#\s*include\s*"peakbound/([A-Za-z0-9_]+)/([^"]+)"')
SOURCES = ('.h', '.cc', '.cu', '.cuh')


def read_order(design):
  """Returns ({folder: level}, {private dir: set of users}) from the `layers` block."""
  text = design.read_text()
  m = re.search(r'^```layers\n(.*?)^```', text, re.S | re.M)
  if not m:
    raise SystemExit(f'check_layers: no ```layers block in {design}')
  level, private = {}, {}
  n = 0
  for line in m.group(1).splitlines():
    line = line.split('#', 1)[0].strip()
    if not line:
      continue
    if line.startswith('private '):
      d, users = line[len('private '):].split(':', 1)
      private[d.strip()] = set(users.split())
      continue
    for d in line.split():
      if d in level:
        raise SystemExit(f'check_layers: {d} is listed twice in the layers block of {design}')
      level[d] = n
    n += 1
  return level, private


def folder_of(rel):
  """The top folder of a path relative to src/peakbound ('ops/gemm.h' -> 'ops'); None for top-level files."""
  parts = pathlib.PurePosixPath(rel).parts
  return parts[0] if len(parts) > 1 else None


def private_dir(rel, private):
  """The private dir a path relative to src/peakbound lies in ('kernels/cpu/gemm.h' -> 'kernels/cpu'), or None."""
  for d in private:
    if rel == d or rel.startswith(d + '/'):
      return d
  return None


def check(root):
  """Returns the list of violations (one line each) for the tree at root."""
  src = root / 'src' / 'peakbound'
  level, private = read_order(root / 'docs' / 'design.md')
  bad = []
  for d in sorted(p.name for p in src.iterdir() if p.is_dir()):
    if d not in level:
      bad.append(f'src/peakbound/{d}/: folder not placed in the layers block of docs/design.md')
  for path in sorted(src.rglob('*')):
    if path.suffix not in SOURCES or not path.is_file():
      continue
    rel = path.relative_to(src).as_posix()
    here = folder_of(rel)
    if here is None or here not in level:
      continue
    here_private = private_dir(rel, private)
    for no, line in enumerate(path.read_text(errors='replace').splitlines(), 1):
      m = INCLUDE.match(line)
      if not m:
        continue
      there, target = m.group(1), f'{m.group(1)}/{m.group(2)}'
      where = f'src/peakbound/{rel}:{no}: includes {target}'
      if there not in level:
        bad.append(f'{where}: folder {there} is not in the layers block of docs/design.md')
        continue
      if level[there] > level[here] or (level[there] == level[here] and there != here):
        bad.append(f'{where}: {here} may not include {there}, which is not below it (docs/design.md, Layering)')
        continue
      p = private_dir(target, private)
      if p and p != here_private and here not in private[p]:
        bad.append(f'{where}: {p} is private to {", ".join(sorted(private[p]))} (docs/design.md, Layering)')
  return bad


def self_test(root):
  """Plants an upward include and one past ops in a copy; passes only if the check names both."""
  with tempfile.TemporaryDirectory() as tmp:
    copy = pathlib.Path(tmp)
    shutil.copytree(root / 'src' / 'peakbound', copy / 'src' / 'peakbound')
    (copy / 'docs').mkdir()
    shutil.copy(root / 'docs' / 'design.md', copy / 'docs' / 'design.md')
    clean = check(copy)
    up = copy / 'src' / 'peakbound' / 'core' / 'planted_up.h'
    up.write_text('#pragma once\n#include "peakbound/schedules/moe_dispatch.h"\n')
    past = copy / 'src' / 'peakbound' / 'schedules' / 'planted_past_ops.cc'
    past.write_text('#include "peakbound/kernels/cpu/gemm.h"\n')
    planted = check(copy)
  new = [b for b in planted if b not in clean]
  ok = (len(new) == 2 and any('core/planted_up.h' in b and 'may not include schedules' in b for b in new) and
        any('schedules/planted_past_ops.cc' in b and 'kernels/cpu is private' in b for b in new))
  print('\n'.join(new) if new else 'check_layers --self-test: the planted includes were not reported')
  print('check_layers --self-test:', 'ok (both planted includes fail the check)' if ok else 'FAILED')
  return 0 if ok else 1


def main():
  ap = argparse.ArgumentParser(description='Fails on a peakbound include that points up the layer order.')
  ap.add_argument('--root', default=str(pathlib.Path(__file__).resolve().parent.parent), help='the repository')
  ap.add_argument('--self-test', action='store_true', help='check that planted upward includes fail')
  a = ap.parse_args()
  root = pathlib.Path(a.root)
  if a.self_test:
    return self_test(root)
  bad = check(root)
  for b in bad:
    print(b)
  print(f'check_layers: {len(bad)} include(s) against the order in docs/design.md' if bad else
        'check_layers: every include points down the order in docs/design.md')
  return 1 if bad else 0


if __name__ == '__main__':
  sys.exit(main())
