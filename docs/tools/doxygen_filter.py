#!/usr/bin/env python3
"""What Doxygen is shown of meshtensor's headers, which document with plain `//` comments
(scripts/docs.sh writes every header's copy with --into; Doxygen's INPUT_FILTER reads them).

The headers are not rewritten for Doxygen; this filter shows Doxygen what a reader sees:
- each header is a group (ops/einsum.hpp: ops_einsum) holding its declarations, and the comment
  that opens it (after `#pragma once`) is the group's documentation, so the header's contract and
  its "Communication:" line lead its API section;
- a `//` block at namespace scope (column 0) right before a declaration becomes that declaration's
  documentation;
- text that Doxygen would read as a command or HTML (`<`, `\\`, `@`, ...) is escaped outside
  backticks, so `einsum<Out...>(a, b)` reads as written.
- a type or call of a `detail` namespace (private to the library) is shown as
  `implementation_defined`, as the C++ standard writes such types, so the reference never names
  `detail::`; in comments the qualifier is dropped.
Line numbers are kept but for one (the title of the header's group), so Doxygen's warnings point
at the header.
"""
import os
import re
import sys

ESCAPE = re.compile(r'([\\@<>&#%$])')


DETAIL = re.compile(r'(typename\s+)?(::)?(meshtensor::)?(\w+::)*\w*detail\w*::')


def hide_detail(code):
    out, pos = [], 0
    for m in DETAIL.finditer(code):
        if m.start() < pos:
            continue
        out.append(code[pos:m.start()])
        end = m.end()
        ident = re.match(r'\w+(::\w+)*', code[end:])
        end += ident.end() if ident else 0
        if end < len(code) and code[end] == '<':  # its template arguments, balanced
            depth, k = 0, end
            while k < len(code):
                depth += {'<': 1, '>': -1}.get(code[k], 0)
                k += 1
                if depth == 0:
                    break
            if depth == 0:
                end = k
                rest = re.match(r'::\w+', code[end:])  # ...<...>::type
                end += rest.end() if rest else 0
        out.append('implementation_defined')
        pos = end
    out.append(code[pos:])
    return ''.join(out)


def escape(lines):
    """A comment block's lines as Doxygen should read them. Lines indented by two or more after a
    blank line (the headers' usage examples) become a code block, as written; other indented lines
    (formulas, lists of cases) start a line of their own (Doxygen's \\n), where Doxygen would run
    them into the paragraph; the rest is escaped outside backticks (a code span may run on to the
    next line)."""
    # A `/*t=*/` inside would nest or end the comment: look-alike characters instead.
    lines = [l.replace('/*', '/\u2217').replace('*/', '\u2217/') for l in lines]
    code = [False] * len(lines)
    for k, l in enumerate(lines):
        if l.startswith('  ') and l.strip() and k and (code[k - 1] or not lines[k - 1].strip()):
            code[k] = True
    prose = [k for k in range(len(lines)) if not code[k]]
    text = re.sub(r'\b\w*detail\w*::', '', '\n'.join(lines[k] for k in prose))
    parts = text.split('`')
    if len(parts) % 2 == 0:  # an unmatched backtick: not a code span, then
        parts[-2] += '\\`' + parts.pop()
    for i in range(0, len(parts), 2):  # backtick spans are code to Doxygen: left as they are
        parts[i] = ESCAPE.sub(r'\\\1', parts[i])
    out = list(lines)
    for k, l in zip(prose, '`'.join(parts).split('\n')):
        out[k] = '\\n ' + l if k and l.startswith('  ') and l.strip() else l
    for k in range(len(lines)):
        if code[k]:
            out[k] = '    ' + re.sub(r'\b\w*detail\w*::', '', lines[k])
    return out


def braces(line):
    """The change in brace depth of a code line (string, character literals and comments aside)."""
    code = re.sub(r'"(\\.|[^"\\])*"|\'(\\.|[^\'\\])*\'', '', line).split('//')[0]
    return code.count('{') - code.count('}')


def group_namespaces(lines, out, group):
    """Adds the declarations of each namespace block to the header's group. Doxygen groups a
    namespace's members only when the group opens inside the namespace, and a namespace opened
    while the group is open would join it whole (rendered again on every page that opens it): so
    the group is closed around each namespace boundary and opened again inside."""
    opening = f' /** @addtogroup {group} */ /** @{{ */'
    depth, namespaces = 0, []  # the depths at which the open namespaces began
    for k, line in enumerate(lines):
        if line.lstrip().startswith(('//', '/*', '*')):
            continue
        if re.match(r'\s*(inline\s+)?namespace\s*[\w:]*\s*\{\s*(//.*)?$', line):
            if namespaces:
                out[k] = '/** @} */ ' + out[k]
            at = out[k].find('//')
            out[k] = out[k] + opening if at < 0 else out[k][:at] + opening.strip() + ' ' + out[k][at:]
            namespaces.append(depth)
            depth += 1
            continue
        depth += braces(line)
        if namespaces and depth <= namespaces[-1]:  # this line closes the innermost namespace
            out[k] = '/** @} */ ' + out[k]
            namespaces.pop()
            if namespaces:  # before the line's `// namespace x` comment, not in it
                at = out[k].find('//')
                out[k] = out[k] + opening if at < 0 else out[k][:at] + opening.strip() + ' ' + out[k][at:]


def group_of(path):
    """The group of header include/meshtensor/ops/einsum.hpp: (ops_einsum, ops/einsum.hpp)."""
    header = path.replace(os.sep, '/').split('include/meshtensor/', 1)[-1]
    return re.sub(r'\W', '_', header[:-len('.hpp')]), header


def filtered(path):
    """The header at path as Doxygen is shown it."""
    group, header = group_of(path)
    with open(path, encoding='utf-8') as f:
        lines = f.read().split('\n')
    # Code first (comments are rewritten below, from the original lines).
    out = [l if l.lstrip().startswith('//') else hide_detail(l) for l in lines]
    i = 0
    # The file's opening comment: the first `//` block, before any code but the pragma.
    while i < len(lines) and (lines[i].strip() in ('', '#pragma once')):
        i += 1
    if i < len(lines) and lines[i].startswith('//'):
        j = i
        while j < len(lines) and lines[j].startswith('//'):
            j += 1
        body = escape([re.sub(r'^// ?', '', l) for l in lines[i:j]])
        # The header is a group of its own (Doxygen puts a namespace's members in the namespace, not
        # in their file): the reference renders each header's group, its comment first. (Its
        # title takes a line: Doxygen's line numbers after it are one more than the header's.)
        out[i] = f'/** @defgroup {group} {header}\n * ' + body[0]
        for k in range(i + 1, j):
            out[k] = ' * ' + body[k - i]
        out[j - 1] += ' */'
        group_namespaces(lines, out, group)
        i = j
    # Column-0 `//` blocks directly followed by a declaration.
    while i < len(lines):
        if lines[i].startswith('// ') or lines[i] == '//':
            j = i
            while j < len(lines) and (lines[j].startswith('// ') or lines[j] == '//'):
                j += 1
            nxt = lines[j] if j < len(lines) else ''
            if nxt and not nxt.startswith(('#', '}', ' ', 'namespace', '//')):
                for k, text in enumerate(escape([re.sub(r'^// ?', '', l) for l in lines[i:j]])):
                    out[i + k] = '/// ' + text
            i = j
        else:
            i += 1
    # Specialisations of std's and Kokkos's templates (numeric_limits, reduction_identity) are not
    # the library's API, and Doxygen cannot place them (it warns): hidden from it.
    for i, line in enumerate(lines):
        if re.match(r'(class|struct) (std|Kokkos)::', line) and i > 0 and lines[i - 1] == 'template <>':
            out[i - 1] = '/** @cond */ ' + out[i - 1]
            end = next(k for k in range(i, len(lines)) if lines[k].startswith('};'))
            out[end] += ' /** @endcond */'
    # Forward declarations (`template <...>` then `class mesh;`) would put a class in the group of
    # a header that only names it (layout/mesh_axes.hpp, besides runtime/mesh.hpp): dropped.
    for i, line in enumerate(lines):
        if re.match(r'(class|struct) \w+;\s*$', line) and i > 0 and lines[i - 1].startswith('template <'):
            out[i - 1] = out[i] = ''
    return '\n'.join(out)


def filter_into(cache, paths):
    """Writes each header's filtered text to cache + its absolute path, in one process: Doxygen
    starts its INPUT_FILTER twice per file, and a Python start per call was most of its time
    (docs/tools/doxygen_cached_filter.sh reads these copies instead)."""
    for path in paths:
        target = cache + os.path.abspath(path)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, 'w', encoding='utf-8') as f:
            f.write(filtered(path))


if __name__ == '__main__':
    if sys.argv[1] == '--into':
        filter_into(sys.argv[2], sys.argv[3:])
    else:
        sys.stdout.write(filtered(sys.argv[1]))
