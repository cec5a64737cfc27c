#!/usr/bin/env python3
"""Checks the documentation site (scripts/docs.sh) as a reader would meet it. ctest label docs.

  check_site.py links SITE ROOT        every internal link and anchor of every page resolves, and
                                       every file path that the pages (ROOT's docs/*.md, README.md)
                                       and the headers' comments (ROOT/include) mention exists
  check_site.py labels PAGE BUILD [ABSENT...]
                                       the ctest labels PAGE lists are BUILD's (`ctest
                                       --print-labels`); ABSENT: labels this build lacks by design
  check_site.py api SITE INCLUDE       the API reference: every public header has its section, a
                                       header's "Communication:" line is on it, no `detail::`
  check_site.py browser SITE SHOTS     headless Chromium renders three pages (front, a guide, the
                                       ops API) with their expected headings; screenshots in SHOTS
  check_site.py design DIR             the design pages (DIR/*.md) state the design, not its history:
                                       none cites an issue number (history is docs/performance.md's
                                       and git's)

Exit status 0: checked; 1: a failure, each named; 77: skipped (what is missing is printed).
"""
import html.parser
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.parse

SKIP = 77


def skip(why):
    print(f'SKIPPED: {why}')
    sys.exit(SKIP)


def need_site(site):
    if not os.path.isfile(os.path.join(site, 'index.html')):
        skip(f'no site at {site} (docs.build builds it; skipped where Doxygen or Sphinx is missing)')


class Page(html.parser.HTMLParser):
    """A page's links (href, src), its anchors (id, name), its headings (and where each starts in
    its text) and its text."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.links, self.ids, self.headings, self.starts, self.text = [], set(), [], [], []
        self._heading = None
        self._length = 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        for key in ('id', 'name'):
            if a.get(key):
                self.ids.add(a[key])
        for key in ('href', 'src'):
            if a.get(key) is not None and tag in ('a', 'img', 'link', 'script'):
                self.links.append(a[key])
        if re.fullmatch(r'h[1-6]', tag):
            self._heading = []
            self.starts.append(self._length)

    def handle_endtag(self, tag):
        if re.fullmatch(r'h[1-6]', tag) and self._heading is not None:
            # Without the theme's permalink sign.
            self.headings.append(''.join(self._heading).replace('\uf0c1', '').replace('\u00b6', '').strip())
            self._heading = None

    def handle_data(self, data):
        self.text.append(data)
        self._length += len(data)
        if self._heading is not None:
            self._heading.append(data)


def parse(path):
    p = Page()
    with open(path, encoding='utf-8') as f:
        p.feed(f.read())
    return p


def pages(site):
    for dirpath, dirnames, files in os.walk(site):
        dirnames[:] = [d for d in dirnames if d not in ('_static', '_sources', '_images')]
        for f in files:
            if f.endswith('.html'):
                yield os.path.join(dirpath, f)


# A file path as the docs and comments write one: an optional folder part, a name, an extension of
# source or docs. Globs, placeholders and URLs are not paths of the tree.
PATH = re.compile(r'(?<![\w/.<*:${}-])((?:[\w.-]+/)*[\w-]+(?:\.[\w-]+)*\.(?:hpp|cpp|h|md|py|sh|cmake))(?![\w*<>])')


# Files named that are not the tree's, each with why.
OUTSIDE = {
    'moe.py': "Mesh-TensorFlow's, which nn/moe.hpp follows",
    'dnnl-config.cmake': "oneDNN's CMake package file",
    'pictures.cpp': 'the program docs/training.md shows, saved by the reader',
}


def tree_files(root):
    """Every file of the source tree, as paths relative to root (build trees and .git left out)."""
    skip = {'.git', 'build', 'node_modules', '__pycache__'}
    for dirpath, dirnames, files in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in skip and not d.startswith(('build-', '.venv'))]
        for f in files:
            yield os.path.relpath(os.path.join(dirpath, f), root).replace(os.sep, '/')


def mentioned_paths(root):
    """(where, path) for each file path that a page or a header's comment mentions. A path is
    written relative to the repository, to include/meshtensor/ or to its own folder, or is a bare
    file name: it must name a file whose path ends with it."""
    pages = [os.path.join(root, 'README.md')]
    for dirpath, dirnames, files in os.walk(os.path.join(root, 'docs')):
        dirnames[:] = [d for d in dirnames if d != 'api']  # generated from the headers
        # performance.md is the history: it names files as they were then.
        pages += [os.path.join(dirpath, f) for f in files if f.endswith('.md') and f != 'performance.md']
    headers = []
    for dirpath, _, files in os.walk(os.path.join(root, 'include')):
        headers += [os.path.join(dirpath, f) for f in files if f.endswith('.hpp')]
    for path in sorted(pages) + sorted(headers):
        is_header = path.endswith('.hpp')
        with open(path, encoding='utf-8') as f:
            for n, line in enumerate(f, 1):
                if line.lstrip().startswith('#include'):
                    continue
                if is_header:
                    if '//' not in line:
                        continue
                    line = line[line.index('//') + 2:]
                for m in PATH.finditer(line):
                    yield path, n, m.group(1)


def check_paths(root):
    files = list(tree_files(root))
    whole = set(files)
    suffixes = set()
    for f in files:
        parts = f.split('/')
        for i in range(1, len(parts)):
            suffixes.add('/'.join(parts[i:]))
    errors, checked = [], 0
    for page, n, path in mentioned_paths(root):
        checked += 1
        beside = os.path.relpath(os.path.normpath(os.path.join(os.path.dirname(page), path)), root).replace(os.sep, '/')
        if path in whole or path in suffixes or beside in whole or path in OUTSIDE:
            continue
        if beside.startswith('docs/api/'):
            continue  # written by docs.sh from the headers
        errors.append(f'{os.path.relpath(page, root)}:{n}: names {path}, which is no file of the tree')
    for e in errors:
        print(e)
    print(f'{checked} file paths named in the pages and the headers\' comments: {len(errors)} missing')
    return errors


def check_links(site, root=None):
    path_errors = check_paths(root) if root else []
    if not os.path.isfile(os.path.join(site, 'index.html')):
        if path_errors:
            return 1
        need_site(site)
    parsed, errors, checked = {}, list(path_errors), 0

    def get(path):
        if path not in parsed:
            parsed[path] = parse(path)
        return parsed[path]

    for page in sorted(pages(site)):
        for link in get(page).links:
            url = urllib.parse.urlsplit(link)
            if url.scheme or link.startswith('//'):
                continue  # outside the site: not followed (no network in the tests)
            target = page if not url.path else os.path.normpath(
                os.path.join(os.path.dirname(page), urllib.parse.unquote(url.path)))
            where = os.path.relpath(page, site)
            checked += 1
            if not os.path.exists(target):
                errors.append(f'{where}: link {link!r}: no {os.path.relpath(target, site)}')
            elif url.fragment and target.endswith('.html'):
                if urllib.parse.unquote(url.fragment) not in get(target).ids:
                    errors.append(f'{where}: link {link!r}: {os.path.relpath(target, site)} has no anchor '
                                  f'#{url.fragment}')
    for e in errors:
        print(e)
    print(f'{checked} internal links in {len(parsed)} pages: {len(errors)} broken')
    return 1 if errors or checked == 0 else 0


def top_comment(path):
    """A header's opening comment, as one string."""
    lines, started = [], False
    with open(path, encoding='utf-8') as f:
        for line in f:
            if line.startswith('//'):
                started = True
                lines.append(line[2:].strip())
            elif started or line.strip() not in ('', '#pragma once'):
                break
    return ' '.join(lines)


def check_api(site, include):
    need_site(site)
    errors, headers = [], 0
    root = os.path.join(include, 'meshtensor')
    texts = {}
    for page in pages(os.path.join(site, 'api')):
        p = parse(page)
        text = ''.join(p.text).replace('\u2019', "'")  # Sphinx's typographic apostrophes
        texts[page] = (p, text)
        if 'detail::' in text:
            at = text.index('detail::')
            errors.append(f'{os.path.relpath(page, site)} names detail::, e.g. ...{text[max(0, at - 60):at + 40]!r}')
    for dirpath, dirnames, files in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != 'detail']
        for h in sorted(files):
            if not h.endswith('.hpp'):
                continue
            rel = os.path.relpath(os.path.join(dirpath, h), root)
            headers += 1
            # Its section: from its heading to the next heading of its level or above.
            found = None
            for page, (p, text) in texts.items():
                if rel in p.headings:
                    n = p.headings.index(rel)
                    end = p.starts[n + 1] if n + 1 < len(p.starts) else len(text)
                    found = text[p.starts[n]:end]
                    break
            if found is None:
                errors.append(f'{rel}: no section in the API reference')
                continue
            comment = top_comment(os.path.join(dirpath, h))
            if 'Communication:' in comment and 'Communication:' not in found:
                errors.append(f'{rel}: its header says "Communication: ...", its API section does not')
            if comment and comment.split()[0].split('<')[0] not in found:
                errors.append(f'{rel}: its API section lacks the header\'s comment ({comment[:60]!r}...)')
    for e in errors:
        print(e)
    print(f'{headers} public headers against {len(texts)} API pages: {len(errors)} problems')
    return 1 if errors or headers == 0 else 0


# The pages a reader opens first, and the headings each must show once rendered.
BROWSER_PAGES = [
    ('index.html', 'front', ['meshtensor', 'Where to start']),
    ('layouts.html', 'guide', ['Layouts and placement', 'A layout is a type', 'Choosing one']),
    ('api/ops.html', 'api', ['ops/: every op and what it communicates', 'ops/einsum.hpp', 'ops/relayout.hpp']),
]


def check_browser(site, shots):
    need_site(site)
    chromium = shutil.which('chromium') or shutil.which('chromium-browser')
    if not chromium:
        skip('no chromium (Debian: chromium; scripts/install_deps.sh installs it)')
    os.makedirs(shots, exist_ok=True)
    errors = []
    with tempfile.TemporaryDirectory() as profile:
        for page, name, expected in BROWSER_PAGES:
            png = os.path.join(shots, name + '.png')
            if os.path.exists(png):
                os.remove(png)
            url = 'file://' + os.path.abspath(os.path.join(site, page))
            # --no-sandbox: the tests run as root in CI, where Chromium's sandbox refuses to start.
            run = subprocess.run([chromium, '--headless', '--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage',
                                  f'--user-data-dir={profile}', '--hide-scrollbars', '--window-size=1280,1600',
                                  f'--screenshot={png}', '--dump-dom', url],
                                 capture_output=True, text=True, timeout=120)
            if run.returncode != 0:
                errors.append(f'{page}: chromium exited {run.returncode}: {run.stderr[-2000:]}')
                continue
            dom = Page()
            dom.feed(run.stdout)
            headings = dom.headings
            for h in expected:
                if h not in headings:
                    errors.append(f'{page}: no heading {h!r} in the rendered page (its headings: {headings[:12]})')
            if name == 'api':
                text = ''.join(dom.text)
                n = headings.index('ops/einsum.hpp') if 'ops/einsum.hpp' in headings else -1
                section = text[dom.starts[n]:dom.starts[n + 1]] if 0 <= n < len(headings) - 1 else ''
                section = ' '.join(section.split())
                for words in ('Communication: one allreduce', 'einsum('):
                    if words not in section:
                        errors.append(f'{page}: the einsum section does not show {words!r}')
            # A rendered page is a picture of some size, not an empty or blank one.
            size = os.path.getsize(png) if os.path.exists(png) else 0
            if size < 20000:
                errors.append(f'{page}: screenshot {png} is {size} bytes: not rendered')
            else:
                print(f'{page}: {len(headings)} headings, screenshot {png} ({size} bytes)')
    for e in errors:
        print(e)
    return 1 if errors else 0


def check_labels(page, build, absent):
    """The labels the page lists (the backquoted single words of the paragraph that says "runs one
    label", outside parentheses) against the build tree's."""
    with open(page, encoding='utf-8') as f:
        text = f.read()
    at = text.find('runs one label')
    if at < 0:
        print(f'{page}: no paragraph that lists the labels ("runs one label")')
        return 1
    paragraph = text[at:].split('\n\n')[0]
    top, depth = [], 0
    for c in paragraph:
        depth += c == '('
        if depth == 0:
            top.append(c)
        depth -= c == ')' and depth > 0
    listed = set(re.findall(r'`([a-z][a-z0-9_]*)`', ''.join(top)))
    out = subprocess.run(['ctest', '--print-labels', '--test-dir', build], capture_output=True, text=True, check=True).stdout
    labels = {l.strip() for l in out.split('All Labels:')[-1].splitlines() if l.strip()}
    errors = [f'{page}: lists no label {l!r}, which tests carry' for l in sorted(labels - listed)]
    errors += [f'{page}: lists the label {l!r}, which no test carries' for l in sorted(listed - labels - set(absent))]
    for e in errors:
        print(e)
    print(f'{len(listed)} labels listed in {page}, {len(labels)} in {build}: {len(errors)} differ')
    return 1 if errors or not labels else 0


ISSUE_CITATION = re.compile(r'\b[Ii]ssues? #?\d+')


def check_design(folder):
    """No design page cites an issue: each finding names the page, the line and the citation."""
    errors = []
    pages = sorted(n for n in os.listdir(folder) if n.endswith('.md'))
    for name in pages:
        with open(os.path.join(folder, name), encoding='utf-8') as f:
            for number, line in enumerate(f, 1):
                errors += [f'{folder}/{name}:{number}: cites "{m.group(0)}" (a design page states the design; its '
                           f'history goes to docs/performance.md and git)' for m in ISSUE_CITATION.finditer(line)]
    for e in errors:
        print(e)
    print(f'{len(pages)} design pages: {len(errors)} issue citations')
    return 1 if errors or not pages else 0


def main(argv):
    if len(argv) >= 3 and argv[1] == 'links':
        return check_links(argv[2], argv[3] if len(argv) >= 4 else None)
    if len(argv) >= 4 and argv[1] == 'labels':
        return check_labels(argv[2], argv[3], argv[4:])
    if len(argv) >= 4 and argv[1] == 'api':
        return check_api(argv[2], argv[3])
    if len(argv) >= 3 and argv[1] == 'design':
        return check_design(argv[2])
    if len(argv) >= 4 and argv[1] == 'browser':
        return check_browser(argv[2], argv[3])
    print(__doc__)
    return 2


if __name__ == '__main__':
    sys.exit(main(sys.argv))
