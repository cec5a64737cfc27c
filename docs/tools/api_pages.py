#!/usr/bin/env python3
"""Writes the API reference's pages (OUT/index.md and one page per folder of include/meshtensor),
each header a section rendered by Breathe from Doxygen's XML (the header's group): the header's opening comment (its
contract and its "Communication:" line) first, then its declarations. Generated at each build, so
a new header appears without anyone listing it. Also drops from the XML the "Subclassed by"
links to the library's detail types (a public base such as exchange<R> has one), so that the
reference never names `detail::`. Usage: api_pages.py INCLUDE_DIR OUT_DIR XML_DIR
"""
import glob
import re
import os
import sys

# Folder, title, and what it keeps (docs/design/layers.md), in the order a reader meets them.
FOLDERS = [
    ('.', 'The library', 'The umbrella header and the error types every layer throws.'),
    ('names', 'names/: dims and axes', 'Dims and mesh axes as types, and the type-level lists of them.'),
    ('layout', 'layout/: meshes as types, layouts', 'The mesh as a type (its axes), layouts and their rules, '
     'the candidate layouts of a tensor. Values only: no MPI.'),
    ('tensor', 'tensor/: the distributed tensor', 'The tensor, its creation and initialisation, host I/O, '
     'and describe().'),
    ('ops', 'ops/: every op and what it communicates', 'Each header opens with the op\'s contract and its '
     '**Communication:** the collectives it runs, over which mesh axes, forward and in its gradient.'),
    ('nn', 'nn/: layers', 'Dense, attention, feed-forward, layer norm, dropout, embeddings, '
     'convolutions, mixture of experts and the Transformer\'s blocks, each saying what it communicates.'),
    ('autodiff', 'autodiff/: gradients', 'The tape, gradient(), accumulation over microbatches, '
     'recomputation, and the backward pass split into input and weight gradients.'),
    ('optim', 'optim/: optimizers', 'SGD, Adam, Adafactor, and optimizer state sharded over the mesh.'),
    ('pipeline', 'pipeline/: pipeline stages', 'Stages of a mesh, the schedules of a step as values, '
     'and the run that walks them.'),
    ('io', 'io/: checkpoints', 'safetensors checkpoints written and read in parallel, resharded on load '
     '(meshtensor::io).'),
    ('plan', 'plan/: plans', 'Collectives and their counters, comm plans, the ledger and reports of '
     'a planned run, and the cost model. No MPI.'),
    ('runtime', 'runtime/: MPI', 'The running mesh, the environment, communicators, collectives, '
     'agreement between ranks, the watchdog.'),
    ('kernels', 'kernels/: local work', 'The one door for each processor\'s local work and its '
     'providers: oneDNN, OpenBLAS, cuBLAS and portable Kokkos kernels.'),
    ('geometry', 'geometry/: slices and exchanges', 'The arithmetic of slices: axis sets, mesh shapes, '
     'splits and placement, boxes, exchanges, windows and the halo schedule. No MPI.'),
    ('element', 'element/: element types', 'bf16, complex numbers, device-callable math, NaN-propagating max and '
     'min.'),
    ('fft', 'fft/: Fourier transforms', 'Transforms along dims a layout keeps whole, by FFTW (meshtensor::fft, '
     'opt-in: not in meshtensor.hpp); distributed ones are these and relayouts.'),
]

def drop_private_subclasses(xml):
    for path in glob.glob(os.path.join(xml, '*.xml')):
        with open(path, encoding='utf-8') as f:
            text = f.read()
        kept = re.sub(r'\s*<derivedcompoundref [^>]*>[^<]*detail[^<]*</derivedcompoundref>', '', text)
        if kept != text:
            with open(path, 'w', encoding='utf-8') as f:
                f.write(kept)


def main(include, out, xml):
    drop_private_subclasses(xml)
    os.makedirs(out, exist_ok=True)
    for old in glob.glob(os.path.join(out, '*.md')):  # a folder gone is gone from the site
        os.remove(old)
    root = os.path.join(include, 'meshtensor')
    seen = set()
    toc = []
    for folder, title, intro in FOLDERS:
        d = os.path.join(root, folder)
        headers = sorted(f for f in os.listdir(d) if f.endswith('.hpp'))
        name = 'core' if folder == '.' else folder
        lines = [f'# {title}', '', intro, '']
        for h in headers:
            rel = h if folder == '.' else f'{folder}/{h}'
            seen.add(rel)
            lines += [f'## {rel}', '', f'`#include <meshtensor/{rel}>`', '',
                      # The header's group (docs/tools/doxygen_filter.py): its comment, then its members.
                      '```{doxygengroup} ' + rel[:-len('.hpp')].replace('/', '_'), ':project: meshtensor',
                      ':members:', '```', '']
        with open(os.path.join(out, name + '.md'), 'w') as f:
            f.write('\n'.join(lines))
        toc.append(name)
    # Every public header is on a page: a folder missing from FOLDERS stops the build.
    for dirpath, dirnames, files in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != 'detail']
        for h in files:
            rel = os.path.relpath(os.path.join(dirpath, h), root)
            if h.endswith('.hpp') and rel not in seen:
                sys.exit(f'api_pages.py: {rel} is on no API page; add its folder to FOLDERS')
    index = ['# API reference', '',
             'Generated from the comments of the public headers (`include/meshtensor/`, without its '
             '`detail` parts). A program includes `<meshtensor/meshtensor.hpp>` (and '
             '`<meshtensor/io/checkpoint.hpp>` for checkpoints); every name is in namespace `meshtensor`.',
             '', '```{toctree}', ':maxdepth: 1', ''] + toc + ['```', '']
    with open(os.path.join(out, 'index.md'), 'w') as f:
        f.write('\n'.join(index))


if __name__ == '__main__':
    main(sys.argv[1], sys.argv[2], sys.argv[3])
